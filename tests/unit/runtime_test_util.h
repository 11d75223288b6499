// Helpers shared by the runtime tests (data, checkpoints, files, tokenizers).
#pragma once
#include <dirent.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "dsc/runtime.h"
#include "runtime/runtime.h"
#include "tests/unit/test_util.h"

namespace rt_test {

// A context for one test; msgs() is its diagnostics, one per line.
struct Ctx {
  dsc_context *ctx = dsc_context_new(nullptr, nullptr);
  ~Ctx() { dsc_context_free(ctx); }
  std::string msgs() const { return diags(ctx); }
};

// A scratch directory removed (recursively, two levels) at the end of the test.
struct TempDir {
  std::string path;
  TempDir() {
    const char *root = getenv("TMPDIR");
    std::string tmpl = std::string(root && *root ? root : "/tmp") + "/dsc_rt_test.XXXXXX";
    std::vector<char> buf(tmpl.begin(), tmpl.end());
    buf.push_back(0);
    path = mkdtemp(buf.data()) ? buf.data() : "";
  }
  ~TempDir() { remove_tree(path); }
  std::string operator/(const std::string &name) const { return path + "/" + name; }
  static void remove_tree(const std::string &p) {
    struct stat sb;
    if (lstat(p.c_str(), &sb) != 0) return;
    if (S_ISDIR(sb.st_mode)) {
      chmod(p.c_str(), 0700);
      if (DIR *d = opendir(p.c_str())) {
        while (struct dirent *e = readdir(d)) {
          std::string n = e->d_name;
          if (n != "." && n != "..") remove_tree(p + "/" + n);
        }
        closedir(d);
      }
      rmdir(p.c_str());
    } else {
      unlink(p.c_str());
    }
  }
};

inline std::vector<std::string> list_dir(const std::string &p) {
  std::vector<std::string> out;
  if (DIR *d = opendir(p.c_str())) {
    while (struct dirent *e = readdir(d)) {
      std::string n = e->d_name;
      if (n != "." && n != "..") out.push_back(n);
    }
    closedir(d);
  }
  return out;
}

inline std::string read_bytes(const std::string &p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

inline void write_bytes(const std::string &p, const std::string &data) {
  std::ofstream f(p, std::ios::binary | std::ios::trunc);
  f.write(data.data(), (std::streamsize)data.size());
}

}  // namespace rt_test
