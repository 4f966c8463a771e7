#include "common/rendezvous.h"

#include <chrono>
#include <cstdio>
#include <sstream>
#include <thread>

#include "common/files.h"

namespace divlab {

namespace {
constexpr const char* kHeader = "divlab-rendezvous 1";

std::string to_hex(const std::string& bytes) {
  std::string out;
  char two[3];
  for (unsigned char c : bytes) std::snprintf(two, sizeof two, "%02x", c), out += two;
  return out;
}

int hex_digit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  return -1;
}

bool from_hex(const std::string& hex, std::string* bytes) {
  if (hex.size() % 2 != 0) return false;
  bytes->clear();
  for (size_t i = 0; i < hex.size(); i += 2) {
    const int high = hex_digit(hex[i]), low = hex_digit(hex[i + 1]);
    if (high < 0 || low < 0) return false;
    bytes->push_back(char(high * 16 + low));
  }
  return true;
}
}  // namespace

void publish_token(const std::string& path, const std::string& nonce, const std::string& token) {
  std::ostringstream text;
  text << kHeader << "\nnonce " << nonce << "\ntoken " << to_hex(token) << "\n";
  if (!write_file_atomically(path, text.str()))
    throw RendezvousError("rendezvous file '" + path + "' cannot be written");
}

bool parse_token(const std::string& text, const std::string& nonce, std::string* token) {
  std::istringstream in(text);
  std::string header, key, value, hex;
  if (!std::getline(in, header) || header != kHeader) return false;
  if (!(in >> key) || key != "nonce") return false;
  std::getline(in >> std::ws, value);
  if (value != nonce) return false;
  if (!(in >> key >> hex) || key != "token") return false;
  return from_hex(hex, token);
}

std::string await_token(const std::string& path, const std::string& nonce, double timeout_s,
                        const std::function<bool()>& give_up) {
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  for (std::string text, token;;) {
    if (read_file(path, text) && parse_token(text, nonce, &token)) return token;
    if (give_up && give_up())
      throw RendezvousError("stopped while waiting for rank 0 at '" + path + "'");
    if (std::chrono::duration<double>(Clock::now() - start).count() > timeout_s)
      throw RendezvousError("rank 0 published nothing at '" + path + "' within " +
                            std::to_string(int(timeout_s)) + " s");
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

}  // namespace divlab
