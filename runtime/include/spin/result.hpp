// Control-path result type: a value or an error with a message (C++20 has no std::expected).
#pragma once

#include <spin/handler.hpp>

#include <string>
#include <utility>
#include <variant>

namespace spin {

/// An error of the control path: the code and a message for humans that names the problem.
struct error {
  errc code = errc::ok;
  std::string message;
};

/// Either a T or a `spin::error`. Never throws; reading the wrong side is a programming error
/// caught by an assertion in debug builds.
template <class T> class [[nodiscard]] result {
public:
  result(T value) : _v(std::in_place_index<0>, std::move(value)) {}
  result(error e) : _v(std::in_place_index<1>, std::move(e)) {}

  bool ok() const { return _v.index() == 0; }
  explicit operator bool() const { return ok(); }
  T& value() & { return std::get<0>(_v); }
  const T& value() const& { return std::get<0>(_v); }
  T&& value() && { return std::get<0>(std::move(_v)); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }
  const error& err() const { return std::get<1>(_v); }

private:
  std::variant<T, error> _v;
};

/// result<void>: success or an error.
template <> class [[nodiscard]] result<void> {
public:
  result() = default;
  result(error e) : _e(std::move(e)) {}
  bool ok() const { return _e.code == errc::ok; }
  explicit operator bool() const { return ok(); }
  const error& err() const { return _e; }

private:
  error _e;
};

/// Builds an error result: `return fail(errc::no_memory, "arena full: ...")`.
inline error fail(errc code, std::string message) { return error{code, std::move(message)}; }

} // namespace spin
