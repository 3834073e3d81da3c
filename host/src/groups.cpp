#include <spin/host/groups.hpp>

namespace spin::host {

const char* name(join_state s) noexcept {
  switch (s) {
    case join_state::install: return "install";
    case join_state::wait: return "wait";
    case join_state::granted: return "granted";
    case join_state::refused: return "refused";
  }
  return "?";
}

} // namespace spin::host
