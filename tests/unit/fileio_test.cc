// runtime/fileio.c and runtime/rundir.c: parent directories, opening only
// regular files (a FIFO never blocks), atomic writes that never replace a
// special file, the run directory's writer lock and stale temporaries.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <unistd.h>

#include <string>

#include "runtime/runtime.h"
#include "runtime_test_util.h"


using rt_test::read_bytes;
using rt_test::Ctx;
using rt_test::TempDir;
using rt_test::write_bytes;

namespace {

std::string parent(dsc_context *ctx, const char *p) {
  char *d = rt_parent_dir(ctx, p);
  std::string s = d ? d : "(null)";
  if (d) ir_free(ctx, d, strlen(d) + 1);
  return s;
}

TEST(FileIo, ParentDirIgnoresTrailingSlashes) {
  Ctx c;
  EXPECT_EQ(parent(c.ctx, "r/step-000020"), "r");
  EXPECT_EQ(parent(c.ctx, "r/step-000020/"), "r");
  EXPECT_EQ(parent(c.ctx, "r/step-000020//"), "r");
  EXPECT_EQ(parent(c.ctx, "a//b"), "a");
  EXPECT_EQ(parent(c.ctx, "/x"), "/");
  EXPECT_EQ(parent(c.ctx, "/x/"), "/");
  EXPECT_EQ(parent(c.ctx, "/"), "/");
  EXPECT_EQ(parent(c.ctx, "x"), ".");
  EXPECT_EQ(parent(c.ctx, "x/"), ".");
  EXPECT_EQ(parent(c.ctx, "/a/b/c"), "/a/b");
}

TEST(FileIo, OpenRegularRefusesFifoWithoutBlocking) {
  Ctx c;
  TempDir t;
  std::string fifo = t / "f";
  ASSERT_EQ(mkfifo(fifo.c_str(), 0666), 0);
  int fd = -1;
  // Without O_NONBLOCK this open would wait forever for a writer.
  EXPECT_EQ(rt_open_regular(c.ctx, fifo.c_str(), 0, &fd), DSC_ERR_USER);
  EXPECT_EQ(fd, -1);
  EXPECT_NE(c.msgs().find("not a regular file (a FIFO)"), std::string::npos) << c.msgs();
  const char *kind = nullptr;
  EXPECT_EQ(rt_open_regular_fd(t.path.c_str(), 0, &kind), -1);
  ASSERT_NE(kind, nullptr);
  EXPECT_STREQ(kind, "a directory");
  std::string reg = t / "r";
  write_bytes(reg, "abc");
  fd = rt_open_regular_fd(reg.c_str(), 0, &kind);
  ASSERT_GE(fd, 0);
  EXPECT_EQ(fcntl(fd, F_GETFL) & O_NONBLOCK, 0);  // cleared after the probe
  close(fd);
  std::string missing = t / "none";
  EXPECT_EQ(rt_open_regular(c.ctx, missing.c_str(), 0, &fd), DSC_ERR_USER);
  EXPECT_NE(c.msgs().find("cannot open: No such file"), std::string::npos) << c.msgs();
}

dsc_status atomic_put(dsc_context *ctx, const std::string &path, const std::string &data) {
  rt_atomic_file f;
  dsc_status st = rt_atomic_open(ctx, path.c_str(), &f);
  if (st != DSC_OK) return st;
  rt_atomic_write(&f, data.data(), data.size());
  return rt_atomic_commit(&f);
}

TEST(FileIo, AtomicWriteIntoCharacterDeviceKeepsTheDevice) {
  Ctx c;
  TempDir t;
  std::string null = t / "null";
  if (mknod(null.c_str(), S_IFCHR | 0666, makedev(1, 3)) != 0) GTEST_SKIP() << "mknod needs root";
  EXPECT_EQ(atomic_put(c.ctx, null, "payload"), DSC_OK) << c.msgs();
  struct stat sb;
  ASSERT_EQ(lstat(null.c_str(), &sb), 0);
  EXPECT_TRUE(S_ISCHR(sb.st_mode));
  std::string full = t / "full";
  ASSERT_EQ(mknod(full.c_str(), S_IFCHR | 0666, makedev(1, 7)), 0);
  EXPECT_EQ(atomic_put(c.ctx, full, "payload"), DSC_ERR_USER);
  EXPECT_NE(c.msgs().find("No space left on device"), std::string::npos) << c.msgs();
  ASSERT_EQ(lstat(full.c_str(), &sb), 0);
  EXPECT_TRUE(S_ISCHR(sb.st_mode));
}

TEST(FileIo, AtomicWriteIntoFifoStreams) {
  Ctx c;
  TempDir t;
  std::string fifo = t / "p";
  ASSERT_EQ(mkfifo(fifo.c_str(), 0666), 0);
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {  // the reader: copies what comes into a file
    int in = open(fifo.c_str(), O_RDONLY), out = open((t / "got").c_str(), O_WRONLY | O_CREAT, 0666);
    char buf[64];
    ssize_t n;
    while ((n = read(in, buf, sizeof buf)) > 0)
      if (write(out, buf, (size_t)n) != n) _exit(1);
    _exit(0);
  }
  EXPECT_EQ(atomic_put(c.ctx, fifo, "through the pipe"), DSC_OK) << c.msgs();
  int status = 0;
  waitpid(pid, &status, 0);
  EXPECT_EQ(read_bytes(t / "got"), "through the pipe");
  struct stat sb;
  ASSERT_EQ(lstat(fifo.c_str(), &sb), 0);
  EXPECT_TRUE(S_ISFIFO(sb.st_mode));
}

TEST(FileIo, AtomicWriteRefusesDirectoryAndKeepsLinks) {
  Ctx c;
  TempDir t;
  std::string dir = t / "d";
  ASSERT_EQ(mkdir(dir.c_str(), 0777), 0);
  EXPECT_EQ(atomic_put(c.ctx, dir, "x"), DSC_ERR_USER);
  EXPECT_NE(c.msgs().find("cannot write here: it is a directory"), std::string::npos) << c.msgs();
  write_bytes(t / "real", "old");
  ASSERT_EQ(symlink("real", (t / "link").c_str()), 0);
  EXPECT_EQ(atomic_put(c.ctx, t / "link", "new"), DSC_OK) << c.msgs();
  struct stat sb;
  ASSERT_EQ(lstat((t / "link").c_str(), &sb), 0);
  EXPECT_TRUE(S_ISLNK(sb.st_mode));
  EXPECT_EQ(read_bytes(t / "real"), "new");
  EXPECT_EQ(atomic_put(c.ctx, t / "fresh", "a"), DSC_OK);
  EXPECT_EQ(read_bytes(t / "fresh"), "a");
}

TEST(RunDir, SecondWriterIsRefusedNamingTheHolder) {
  Ctx c;
  TempDir t;
  rt_run_lock *a = nullptr, *b = nullptr;
  ASSERT_EQ(rt_run_lock_take(c.ctx, t.path.c_str(), &a), DSC_OK) << c.msgs();
  // flock conflicts between two open file descriptions, even in one process
  EXPECT_EQ(rt_run_lock_take(c.ctx, t.path.c_str(), &b), DSC_ERR_USER);
  EXPECT_EQ(b, nullptr);
  std::string want = "is in use by dsc (pid " + std::to_string(getpid()) + ")";
  EXPECT_NE(c.msgs().find(want), std::string::npos) << c.msgs();
  rt_run_lock_release(a);
  ASSERT_EQ(rt_run_lock_take(c.ctx, t.path.c_str(), &b), DSC_OK) << c.msgs();
  rt_run_lock_release(b);
}

// A run directory moved away (or replaced by a new one of the same name)
// is no longer the one the lock holds: saves must stop, not write there.
TEST(RunDir, AMovedOrReplacedDirectoryIsNoLongerTheLockedOne) {
  Ctx c;
  TempDir t;
  std::string run = t / "run", moved = t / "moved";
  ASSERT_EQ(mkdir(run.c_str(), 0777), 0);
  rt_run_lock *l = nullptr;
  ASSERT_EQ(rt_run_lock_take(c.ctx, run.c_str(), &l), DSC_OK) << c.msgs();
  EXPECT_EQ(rt_run_lock_check(l, run.c_str()), DSC_OK) << c.msgs();
  EXPECT_EQ(rt_run_lock_check(nullptr, run.c_str()), DSC_OK);
  ASSERT_EQ(rename(run.c_str(), moved.c_str()), 0);
  EXPECT_EQ(rt_run_lock_check(l, run.c_str()), DSC_ERR_USER);  // gone
  ASSERT_EQ(mkdir(run.c_str(), 0777), 0);
  EXPECT_EQ(rt_run_lock_check(l, run.c_str()), DSC_ERR_USER);  // a new directory, no lock file
  FILE *f = fopen((run + "/.lock").c_str(), "w");
  ASSERT_NE(f, nullptr);
  fclose(f);
  EXPECT_EQ(rt_run_lock_check(l, run.c_str()), DSC_ERR_USER);  // another lock file
  EXPECT_NE(c.msgs().find(run + ": the run directory was moved, removed or replaced while "
                                "this run held it"),
            std::string::npos)
      << c.msgs();
  EXPECT_EQ(rt_run_lock_check(l, moved.c_str()), DSC_OK);  // where it went is still its own
  rt_run_lock_release(l);
}

TEST(RunDir, StaleTemporariesOfDeadProcessesAreRemoved) {
  Ctx c;
  TempDir t;
  pid_t dead = fork();
  if (dead == 0) _exit(0);
  waitpid(dead, nullptr, 0);
  std::string gone = t / (".step-000003.tmp-" + std::to_string(dead));
  std::string live = t / (".step-000004.tmp-" + std::to_string(getppid()));
  ASSERT_EQ(mkdir(gone.c_str(), 0777), 0);
  ASSERT_EQ(mkdir(live.c_str(), 0777), 0);
  write_bytes(gone + "/model.safetensors", "partial");
  ASSERT_EQ(mkdir((t / "step-000002").c_str(), 0777), 0);
  EXPECT_EQ(rt_run_clean_stale(c.ctx, t.path.c_str(), false), 1);
  EXPECT_NE(access(gone.c_str(), F_OK), 0);
  EXPECT_EQ(access(live.c_str(), F_OK), 0);  // its process may still be saving
  EXPECT_NE(c.msgs().find("removed what an interrupted save"), std::string::npos) << c.msgs();
  rt_run_lock *l = nullptr;
  ASSERT_EQ(rt_run_lock_take(c.ctx, t.path.c_str(), &l), DSC_OK);  // holding it: all are stale
  EXPECT_NE(access(live.c_str(), F_OK), 0);
  EXPECT_EQ(access((t / "step-000002").c_str(), F_OK), 0);
  rt_run_lock_release(l);
}

TEST(RunDir, RemovingAStepNeverFollowsALink) {
  TempDir t;
  ASSERT_EQ(mkdir((t / "victim").c_str(), 0777), 0);
  write_bytes(t / "victim/keep", "x");
  ASSERT_EQ(symlink("victim", (t / "step-000001").c_str()), 0);
  EXPECT_FALSE(rt_remove_flat_dir((t / "step-000001").c_str()));
  EXPECT_EQ(read_bytes(t / "victim/keep"), "x");
}

}  // namespace
