// SHA-256 as lowercase hex (OpenSSL's libcrypto): the identity of corpora, tokenizer caches and
// grids.
#pragma once

#include <string>

namespace divlab {

std::string sha256_hex(const std::string& data);

}  // namespace divlab
