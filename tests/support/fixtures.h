// Text fixtures made by the tests themselves (no third-party text in the repository): sentences
// of invented words with Zipfian word frequencies, punctuation and some non-ASCII UTF-8.
#pragma once

#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

namespace divlab::testing {

// The folders temp_dir made, removed when the test program ends (their traces and corpora
// come to gigabytes over a few runs of the suite); DIVLAB_KEEP_TEST_FILES=1 keeps them. Only by
// the process that made them: a test's forked child that exits normally leaves them alone.
class TempFolders {
 public:
  void add(std::string path) {
    const std::lock_guard<std::mutex> hold(mutex_);
    paths_.push_back(std::move(path));
  }
  ~TempFolders() {
    if (getpid() != owner_ || std::getenv("DIVLAB_KEEP_TEST_FILES") != nullptr) return;
    std::error_code ignored;
    for (const std::string& p : paths_) std::filesystem::remove_all(p, ignored);
  }

 private:
  pid_t owner_ = getpid();
  std::mutex mutex_;
  std::vector<std::string> paths_;
};

inline std::string temp_dir(const std::string& tag) {
  static TempFolders made;
  std::string pattern = "/tmp/divlab_" + tag + "_XXXXXX";
  if (mkdtemp(pattern.data()) == nullptr) throw std::runtime_error("mkdtemp: " + pattern);
  made.add(pattern);
  return pattern;
}

inline std::vector<std::string> fixture_lines(int n_lines, uint64_t seed) {
  std::mt19937_64 gen(seed);
  const std::vector<std::string> syllables = {"ka", "lo", "mi", "tur", "en", "sa", "vo",   "ré",
                                              "qu", "ix", "na", "ïs",  "do", "be", "ström"};
  std::vector<std::string> lexicon;
  for (int w = 0; w < 600; ++w) {
    std::string word;
    const int n = 1 + int(gen() % 3);
    for (int s = 0; s < n; ++s) word += syllables[gen() % syllables.size()];
    if (w % 37 == 0) word[0] = char(std::toupper(word[0]));
    lexicon.push_back(word);
  }
  lexicon.push_back("—");
  lexicon.push_back("日本");
  std::vector<double> weight(lexicon.size());
  for (size_t r = 0; r < weight.size(); ++r) weight[r] = 1.0 / std::pow(double(r + 1), 1.1);
  std::discrete_distribution<size_t> pick(weight.begin(), weight.end());
  const std::vector<std::string> punct = {",", ";", ":"};
  std::vector<std::string> lines;
  for (int l = 0; l < n_lines; ++l) {
    std::string line;
    const int words = 4 + int(gen() % 14);
    for (int w = 0; w < words; ++w) {
      if (w) line += ' ';
      line += lexicon[pick(gen)];
      if (w + 1 < words && gen() % 9 == 0) line += punct[gen() % punct.size()];
    }
    line += gen() % 4 ? "." : " ?";
    lines.push_back(line);
  }
  return lines;
}

// Writes `n_lines` fixture lines to `path`.
inline void write_fixture(const std::string& path, int n_lines, uint64_t seed) {
  std::ofstream out(path);
  for (const auto& l : fixture_lines(n_lines, seed)) out << l << "\n";
}

}  // namespace divlab::testing
