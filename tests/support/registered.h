// A variant registered in a catalogue for one test and removed after it.
#pragma once

#include <string>
#include <utility>

namespace divlab::testing {

template <class Variants>
class Registered {
 public:
  template <class Fn>
  Registered(Variants& v, std::string name, Fn fn) : v_(v), name_(std::move(name)) {
    v_.add(name_, fn, {"a test kernel", "", "", ""});
  }
  ~Registered() { v_.remove(name_); }
  Registered(const Registered&) = delete;
  Registered& operator=(const Registered&) = delete;

 private:
  Variants& v_;
  std::string name_;
};

}  // namespace divlab::testing
