#include "common/sha256.h"

#include <openssl/evp.h>

namespace divlab {

std::string sha256_hex(const std::string& data) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  EVP_Digest(data.data(), data.size(), digest, &len, EVP_sha256(), nullptr);
  static const char* hex = "0123456789abcdef";
  std::string out;
  for (unsigned i = 0; i < len; ++i) out += hex[digest[i] >> 4], out += hex[digest[i] & 15];
  return out;
}

}  // namespace divlab
