// The collective engine with the argmax test reduction.
#include <spin/coll/engine.hpp>

#include "argmax.hpp"

SPIN_COLL_ENGINE(spin::coll::single_reduction<argmax>)
