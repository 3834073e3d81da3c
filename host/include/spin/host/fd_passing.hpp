// One line of the control protocol with file descriptors attached (SCM_RIGHTS): shared by the
// control server (emulator/src/control.cpp) and the host client (host/src/client.cpp).
#pragma once

#include <array>
#include <cstddef>
#include <cstring>
#include <span>
#include <vector>

#include <sys/socket.h>
#include <sys/types.h>

namespace spin::host::detail {

/// Most descriptors one message carries, in either direction.
inline constexpr std::size_t max_passed_fds = 16;

/// sendmsg of `data` with `fds` (at most max_passed_fds; none when empty) as SCM_RIGHTS.
/// Returns sendmsg's result; errno as sendmsg sets it.
inline ssize_t send_with_fds(int sock, const char* data, std::size_t len, std::span<const int> fds, int flags) noexcept {
  iovec iov{const_cast<char*>(data), len};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  alignas(cmsghdr) std::array<char, CMSG_SPACE(sizeof(int) * max_passed_fds)> cbuf{};
  if (!fds.empty()) {
    msg.msg_control = cbuf.data();
    msg.msg_controllen = CMSG_SPACE(sizeof(int) * fds.size());
    cmsghdr* cm = CMSG_FIRSTHDR(&msg);
    cm->cmsg_level = SOL_SOCKET;
    cm->cmsg_type = SCM_RIGHTS;
    cm->cmsg_len = CMSG_LEN(sizeof(int) * fds.size());
    std::memcpy(CMSG_DATA(cm), fds.data(), sizeof(int) * fds.size());
  }
  return ::sendmsg(sock, &msg, flags);
}

/// recvmsg into `buf` (MSG_CMSG_CLOEXEC is added to `flags`). Descriptors that came with the
/// bytes are appended to `fds` (the caller owns them, also on errors); `truncated` says the
/// kernel dropped some (more than max_passed_fds). Returns recvmsg's result; errno as it sets it.
inline ssize_t recv_with_fds(int sock, std::span<char> buf, std::vector<int>& fds, bool& truncated, int flags) noexcept {
  alignas(cmsghdr) std::array<char, CMSG_SPACE(sizeof(int) * max_passed_fds)> cbuf{};
  iovec iov{buf.data(), buf.size()};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = cbuf.data();
  msg.msg_controllen = cbuf.size();
  const ssize_t n = ::recvmsg(sock, &msg, flags | MSG_CMSG_CLOEXEC);
  const int saved = errno;
  for (cmsghdr* cm = CMSG_FIRSTHDR(&msg); cm != nullptr; cm = CMSG_NXTHDR(&msg, cm)) {
    if (cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS) continue;
    const std::size_t count = (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (std::size_t i = 0; i < count; ++i) {
      int fd;
      std::memcpy(&fd, CMSG_DATA(cm) + i * sizeof(int), sizeof(int));
      fds.push_back(fd);
    }
  }
  truncated = (msg.msg_flags & MSG_CTRUNC) != 0;
  errno = saved;
  return n;
}

}  // namespace spin::host::detail
