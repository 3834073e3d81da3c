// The standard collective package: the collective engine (spin/coll/engine.hpp) with every
// standard reduction (sum, min, max, prod over f32, f64, f16, bf16, i32, i64, u32, u64; sum,
// min, max over the block formats: OCP MX and block floating point).
// spin::coll installs it on every NIC of a communicator (docs/collectives.md).
#include <spin/coll/engine.hpp>

SPIN_COLL_ENGINE(spin::coll::standard_reductions)
