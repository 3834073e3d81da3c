// The NIC side of the complex_prod reduction: the collective engine with one reduction in it.
// spinc compiles this file into complex_prod.native.spkg; spin::coll installs the package on
// every rank's NIC (communicator::add_reduction).
#include <spin/coll/engine.hpp>

#include "complex_prod.hpp"

SPIN_COLL_ENGINE(spin::coll::single_reduction<complex_prod>)
