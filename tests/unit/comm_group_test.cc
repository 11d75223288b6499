// Groups (dsc_comm_split), all_to_all(_v) and meshes on the in-process
// communicator: results against references computed here, groups' ranks and
// names, and the failure modes (a mismatch of all_to_all_v counts, a timeout
// inside a group, an abort seen from a group) ending in named errors, not
// hangs.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "dsc/comm.h"
#include "dsc/mesh.h"
#include "ir/ir.h"
#include "tests/unit/comm_test_util.h"
#include "tests/unit/test_util.h"

namespace {

using comm_test::Ctx;
using comm_test::run_ranks;

dsc_status fail_from(dsc_comm *c, const char *what) {
  ADD_FAILURE() << "rank " << dsc_comm_rank(c) << ": " << what
                << " failed: " << diags(dsc_comm_context(c));
  return DSC_ERR_USER;
}

// The element rank `from` sends to rank `to` at position i: never zero, all distinct.
double elem(int from, int to, int64_t i) { return 1 + from * 1000 + to * 100000 + i * 0.5; }

class AllToAll : public ::testing::TestWithParam<int> {};

TEST_P(AllToAll, EveryRankGetsItsChunkFromEveryRankAlsoInPlace) {
  const int world = GetParam();
  const int64_t count = 7;
  Ctx ctx;
  dsc_status st = run_ranks(ctx.ctx, world, [&](dsc_comm *c) -> dsc_status {
    int r = dsc_comm_rank(c);
    std::vector<double> send(count * world), recv(count * world, -1);
    for (int j = 0; j < world; j++)
      for (int64_t i = 0; i < count; i++) send[j * count + i] = elem(r, j, i);
    if (dsc_comm_all_to_all(c, send.data(), recv.data(), count, DSC_F64, 1))
      return fail_from(c, "a2a");
    for (int q = 0; q < world; q++)
      for (int64_t i = 0; i < count; i++) EXPECT_EQ(recv[q * count + i], elem(q, r, i));
    // In place, in bf16-sized elements (bytes move as they are).
    std::vector<uint16_t> buf(3 * world);
    for (int j = 0; j < world; j++)
      for (int i = 0; i < 3; i++) buf[j * 3 + i] = (uint16_t)(r * 64 + j * 4 + i);
    if (dsc_comm_all_to_all(c, buf.data(), buf.data(), 3, DSC_BF16, 2))
      return fail_from(c, "a2a in place");
    for (int q = 0; q < world; q++)
      for (int i = 0; i < 3; i++) EXPECT_EQ(buf[q * 3 + i], (uint16_t)(q * 64 + r * 4 + i));
    return DSC_OK;
  });
  EXPECT_EQ(st, DSC_OK) << diags(ctx.ctx);
}

TEST_P(AllToAll, CountsDifferPerPeerWithGapsAndEmptyRanges) {
  const int world = GetParam();
  Ctx ctx;
  // Rank i sends n(i, j) elements to rank j; n is 0 for some pairs.
  auto n = [](int i, int j) { return (int64_t)((i * 3 + j * 2) % 4); };
  dsc_status st = run_ranks(ctx.ctx, world, [&](dsc_comm *c) -> dsc_status {
    int r = dsc_comm_rank(c);
    std::vector<int64_t> sc(world), sd(world), rc(world), rd(world);
    int64_t at = 0;
    // Send ranges in reverse rank order with a gap of 2 after each.
    for (int j = world - 1; j >= 0; j--) sc[j] = n(r, j), sd[j] = at, at += sc[j] + 2;
    std::vector<float> send(at, -7.0f);
    for (int j = 0; j < world; j++)
      for (int64_t i = 0; i < sc[j]; i++) send[sd[j] + i] = (float)elem(r, j, i);
    at = 1;  // receive from offset 1, ranges in rank order, a gap of 1
    for (int q = 0; q < world; q++) rc[q] = n(q, r), rd[q] = at, at += rc[q] + 1;
    std::vector<float> recv(at, -3.0f);
    if (dsc_comm_all_to_all_v(c, send.data(), sc.data(), sd.data(), recv.data(), rc.data(),
                              rd.data(), DSC_F32, 4))
      return fail_from(c, "a2av");
    for (int q = 0; q < world; q++)
      for (int64_t i = 0; i < rc[q]; i++) EXPECT_EQ(recv[rd[q] + i], (float)elem(q, r, i));
    // The gaps are untouched.
    EXPECT_EQ(recv[0], -3.0f);
    for (int q = 0; q < world; q++) EXPECT_EQ(recv[rd[q] + rc[q]], -3.0f);
    return DSC_OK;
  });
  EXPECT_EQ(st, DSC_OK) << diags(ctx.ctx);
}

INSTANTIATE_TEST_SUITE_P(Worlds, AllToAll, ::testing::Values(1, 2, 3, 4, 7));

TEST(AllToAllV, CountsThatDisagreeFailEveryRankNamingThePair) {
  Ctx ctx;
  std::mutex mu;
  std::vector<std::string> msgs(3);
  dsc_status st = run_ranks(ctx.ctx, 3, [&](dsc_comm *c) -> dsc_status {
    int r = dsc_comm_rank(c);
    std::vector<int64_t> sc = {1, 1, 1}, sd = {0, 1, 2}, rc = {1, 1, 1}, rd = {0, 1, 2};
    if (r == 2) rc[0] = 2, rd[1] = 2, rd[2] = 3;  // expects 2 from rank 0, which sends 1
    std::vector<double> send(3, r), recv(4);
    dsc_status s = dsc_comm_all_to_all_v(c, send.data(), sc.data(), sd.data(), recv.data(),
                                         rc.data(), rd.data(), DSC_F64, 9);
    std::lock_guard<std::mutex> g(mu);
    msgs[r] = diags(dsc_comm_context(c));
    return s;
  });
  EXPECT_EQ(st, DSC_ERR_USER);
  for (int r = 0; r < 3; r++)
    EXPECT_NE(msgs[r].find("rank " + std::to_string(r) +
                           ": all_to_all_v #0 (step 9) failed: rank 0 sends 1 elements to rank "
                           "2, which expects 2 from it"),
              std::string::npos)
        << msgs[r];
}

TEST(AllToAllV, BadRangesFailOnTheCallerBeforeAnyRankWaits) {
  Ctx ctx;
  dsc_status st = run_ranks(ctx.ctx, 2, [&](dsc_comm *c) -> dsc_status {
    dsc_context *cx = dsc_comm_context(c);
    std::vector<double> send(4), recv(4);
    int64_t sc[2] = {1, 1}, sd[2] = {0, 1}, rd[2] = {0, 1};
    int64_t overlap[2] = {0, 0}, neg[2] = {1, -1}, rc2[2] = {2, 1};
    dsc_comm_request *req = nullptr;
    // recv ranges [0, 2) and [0, 1) overlap
    EXPECT_EQ(dsc_comm_all_to_all_v_start(c, send.data(), sc, sd, recv.data(), rc2, overlap,
                                          DSC_F64, 1, &req),
              DSC_ERR_USER);
    EXPECT_NE(diags(cx).find("the recv ranges of ranks 0 and 1 overlap ([0, 2) and [0, 1))"),
              std::string::npos)
        << diags(cx);
    EXPECT_EQ(
        dsc_comm_all_to_all_v_start(c, send.data(), neg, sd, recv.data(), sc, rd, DSC_F64, 1, &req),
        DSC_ERR_USER);
    EXPECT_NE(diags(cx).find("send count -1 at displacement 1 for rank 1"), std::string::npos);
    EXPECT_EQ(
        dsc_comm_all_to_all_v_start(c, send.data(), sc, sd, send.data(), sc, rd, DSC_F64, 1, &req),
        DSC_ERR_USER);
    EXPECT_NE(diags(cx).find("send and recv are the same buffer"), std::string::npos);
    EXPECT_EQ(dsc_comm_all_to_all_v_start(c, send.data(), nullptr, sd, recv.data(), sc, rd, DSC_F64,
                                          1, &req),
              DSC_ERR_USER);
    EXPECT_EQ(req, nullptr);
    dsc_diag_clear(cx);
    // The ranks are still in step: a good one completes.
    return dsc_comm_all_to_all_v(c, send.data(), sc, sd, recv.data(), sc, rd, DSC_F64, 2);
  });
  EXPECT_EQ(st, DSC_OK) << diags(ctx.ctx);
}

TEST(CommSplit, GroupsRankByKeyNameTheirRanksAndRunTheirOwnCollectives) {
  const int world = 6;
  Ctx ctx;
  dsc_status st = run_ranks(ctx.ctx, world, [&](dsc_comm *c) -> dsc_status {
    int r = dsc_comm_rank(c);
    EXPECT_STREQ(dsc_comm_name(c), "world");
    // Even and odd ranks; key -r: the highest world rank is group rank 0.
    dsc_comm *g = nullptr;
    if (dsc_comm_split(c, r % 2, -r, "parity", &g)) return fail_from(c, "split");
    EXPECT_NE(g, nullptr);
    if (!g) return DSC_ERR_USER;
    EXPECT_STREQ(dsc_comm_name(g), "parity");
    EXPECT_EQ(dsc_comm_world(g), 3);
    std::vector<int> members;
    for (int q = world - 1; q >= 0; q--)
      if (q % 2 == r % 2) members.push_back(q);
    for (int i = 0; i < 3; i++) EXPECT_EQ(dsc_comm_world_rank(g, i), members[i]);
    EXPECT_EQ(dsc_comm_world_rank(g, dsc_comm_rank(g)), r);
    EXPECT_EQ(dsc_comm_world_rank(g, 3), -1);
    // The groups' collectives are independent: odd ranks run two, even ones one.
    double x = r, y = 0;
    if (dsc_comm_all_reduce(g, &x, &y, 1, DSC_F64, DSC_COMM_SUM, 0)) return fail_from(g, "ar");
    EXPECT_EQ(y, r % 2 ? 1 + 3 + 5 : 0 + 2 + 4);
    if (r % 2 && dsc_comm_barrier(g, 1)) return fail_from(g, "barrier");
    // all_to_all inside the group: group rank q's chunk for me.
    int gr = dsc_comm_rank(g);
    std::vector<double> s(3), v(3);
    for (int j = 0; j < 3; j++) s[j] = elem(r, dsc_comm_world_rank(g, j), 0);
    if (dsc_comm_all_to_all(g, s.data(), v.data(), 1, DSC_F64, 2)) return fail_from(g, "a2a");
    for (int q = 0; q < 3; q++) EXPECT_EQ(v[q], elem(members[q], r, 0)) << "group rank " << gr;
    // A group of the group, and a color that joins none.
    dsc_comm *sub = nullptr;
    if (dsc_comm_split(g, gr == 2 ? -1 : 0, gr, "pair", &sub)) return fail_from(g, "split 2");
    EXPECT_EQ(sub == nullptr, gr == 2);
    if (sub) {
      EXPECT_EQ(dsc_comm_world(sub), 2);
      EXPECT_EQ(dsc_comm_world_rank(sub, 0), members[0]);  // ranked through to the world
      double z = 1, zs = 0;
      if (dsc_comm_all_reduce(sub, &z, &zs, 1, DSC_F64, DSC_COMM_SUM, 3))
        return fail_from(sub, "sub ar");
      EXPECT_EQ(zs, 2);
    }
    dsc_comm_free(sub);
    dsc_comm_free(g);
    // The world's own numbering went on: split's gathers were its collectives.
    return dsc_comm_barrier(c, 9);
  });
  EXPECT_EQ(st, DSC_OK) << diags(ctx.ctx);
}

TEST(CommSplit, BadNamesAreRefusedBeforeTheCollective) {
  Ctx ctx;
  dsc_status st = run_ranks(ctx.ctx, 2, [&](dsc_comm *c) -> dsc_status {
    dsc_comm *g = nullptr;
    EXPECT_EQ(dsc_comm_split(c, 0, 0, "", &g), DSC_ERR_USER);
    EXPECT_EQ(dsc_comm_split(c, 0, 0, "has space", &g), DSC_ERR_USER);
    EXPECT_EQ(dsc_comm_split(c, 0, 0, "a_name_that_is_far_too_long", &g), DSC_ERR_USER);
    EXPECT_NE(diags(dsc_comm_context(c)).find("group name 'has space' must be 1 to 23"),
              std::string::npos);
    dsc_diag_clear(dsc_comm_context(c));
    return dsc_comm_barrier(c, 0);  // nothing was started: still in step
  });
  EXPECT_EQ(st, DSC_OK) << diags(ctx.ctx);
}

TEST(CommSplit, ATimeoutInAGroupNamesTheGroupAndTheWorldRanks) {
  Ctx ctx;
  std::atomic<int> done{0};
  std::string m1;
  dsc_status st = run_ranks(ctx.ctx, 4, [&](dsc_comm *c) -> dsc_status {
    int r = dsc_comm_rank(c);
    dsc_comm *g = nullptr;
    if (dsc_comm_split(c, r / 2, r, "ep", &g)) return fail_from(c, "split");
    dsc_comm_set_timeout(g, 0.2);
    dsc_status s = DSC_OK;
    if (r == 2) {  // never joins its group's barrier
      while (done.load() < 1) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    } else if (r == 3) {
      s = dsc_comm_barrier(g, 5);
      m1 = diags(dsc_comm_context(c));
      done++;
    }
    dsc_comm_free(g);
    return s;
  });
  EXPECT_EQ(st, DSC_ERR_USER);
  EXPECT_NE(m1.find("rank 3 (ep rank 1): ep barrier #0 (step 5) timed out after 0.2 s waiting "
                    "for rank 2"),
            std::string::npos)
      << m1;
}

TEST(CommSplit, AnAbortElsewhereFailsAGroupsWaitPromptly) {
  Ctx ctx;
  std::string m0;
  auto t0 = std::chrono::steady_clock::now();
  dsc_status st = run_ranks(ctx.ctx, 4, [&](dsc_comm *c) -> dsc_status {
    int r = dsc_comm_rank(c);
    dsc_comm *g = nullptr;
    if (dsc_comm_split(c, r % 2, r, "dp", &g)) return fail_from(c, "split");
    dsc_status s = DSC_OK;
    if (r == 3) {
      dsc_comm_abort(c, "disk full");
      s = DSC_ERR_USER;
    } else if (r == 1) {  // waits on rank 3 in its group (default timeout: 300 s)
      double x = 1, y;
      s = dsc_comm_all_reduce(g, &x, &y, 1, DSC_F64, DSC_COMM_SUM, 4);
      m0 = diags(dsc_comm_context(c));
    }
    dsc_comm_free(g);
    return s;
  });
  EXPECT_EQ(st, DSC_ERR_USER);
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 5.0);
  EXPECT_NE(m0.find("rank 1 (dp rank 0): dp all_reduce #0 (step 4) failed: rank 3 aborted: disk "
                    "full"),
            std::string::npos)
      << m0;
}

TEST(Mesh, ShapesParseWithDpImpliedAndErrorsNameTheNumbers) {
  Ctx ctx;
  dsc_mesh_shape s;
  char buf[64];
  ASSERT_EQ(dsc_mesh_parse(ctx.ctx, "dp=2,ep=2", 4, &s), DSC_OK) << diags(ctx.ctx);
  dsc_mesh_format(&s, buf, sizeof buf);
  EXPECT_STREQ(buf, "dp=2,ep=2");
  ASSERT_EQ(dsc_mesh_parse(ctx.ctx, "tp=2,sp=2", 8, &s), DSC_OK);
  dsc_mesh_format(&s, buf, sizeof buf);
  EXPECT_STREQ(buf, "dp=2,tp=2,sp=2");  // dp takes what is left, first
  EXPECT_EQ(dsc_mesh_size(&s, "ep"), 1);
  EXPECT_EQ(dsc_mesh_axis(&s, "sp"), 2);
  EXPECT_EQ(dsc_mesh_world(&s), 8);
  ASSERT_EQ(dsc_mesh_parse(ctx.ctx, nullptr, 3, &s), DSC_OK);
  dsc_mesh_format(&s, buf, sizeof buf);
  EXPECT_STREQ(buf, "dp=3");
  // Coordinates: row-major, the last axis fastest.
  ASSERT_EQ(dsc_mesh_parse(ctx.ctx, "dp=2,ep=3", 6, &s), DSC_OK);
  EXPECT_EQ(dsc_mesh_coord(&s, 4, 0), 1);
  EXPECT_EQ(dsc_mesh_coord(&s, 4, 1), 1);
  EXPECT_EQ(dsc_mesh_coord(&s, 2, 1), 2);
  struct Bad {
    const char *spec;
    int world;
    const char *msg;
  } bad[] = {
      {"dp=2,ep=2", 8, "--mesh dp=2,ep=2: the axes multiply to 4 ranks, but the job has 8"},
      {"ep=3", 4, "--mesh ep=3: the axes multiply to 3, which does not divide the world of 4"},
      {"xp=2", 2, "unknown axis 'xp' (the axes are dp, ep, sp, tp)"},
      {"ep=2,ep=2", 4, "axis ep is given twice"},
      {"ep=0", 4, "the size of ep must be a whole number >= 1, got '0'"},
      {"ep=2x", 4, "got '2x'"},
      {"ep", 4, "expected axis=size (e.g. dp=2,ep=2), got 'ep'"},
      {"ep=2,", 4, "a trailing comma"},
  };
  for (const Bad &b : bad) {
    dsc_diag_clear(ctx.ctx);
    EXPECT_EQ(dsc_mesh_parse(ctx.ctx, b.spec, b.world, &s), DSC_ERR_USER) << b.spec;
    EXPECT_NE(diags(ctx.ctx).find(b.msg), std::string::npos) << diags(ctx.ctx);
  }
}

TEST(Mesh, EachAxisGroupHoldsTheRanksThatDifferOnlyThere) {
  const int world = 8;
  Ctx ctx;
  dsc_mesh_shape shape;
  ASSERT_EQ(dsc_mesh_parse(ctx.ctx, "dp=2,ep=2,tp=2", world, &shape), DSC_OK);
  const char *axes[3] = {"dp", "ep", "tp"};
  const int stride[3] = {4, 2, 1};  // rank = 4 dp + 2 ep + tp
  dsc_status st = run_ranks(ctx.ctx, world, [&](dsc_comm *c) -> dsc_status {
    int r = dsc_comm_rank(c);
    dsc_mesh *m = nullptr;
    if (dsc_mesh_new(c, &shape, &m)) return fail_from(c, "mesh");
    EXPECT_EQ(dsc_mesh_group(m, "sp"), nullptr);
    for (int a = 0; a < 3; a++) {
      dsc_comm *g = dsc_mesh_group(m, axes[a]);
      EXPECT_STREQ(dsc_comm_name(g), axes[a]);
      EXPECT_EQ(dsc_comm_world(g), 2);
      int coord = r / stride[a] % 2;
      EXPECT_EQ(dsc_comm_rank(g), coord);
      for (int k = 0; k < 2; k++)
        EXPECT_EQ(dsc_comm_world_rank(g, k), r + (k - coord) * stride[a]) << axes[a];
      // Sum of the world ranks in the group, through the group.
      double x = r, y = 0;
      if (dsc_comm_all_reduce(g, &x, &y, 1, DSC_F64, DSC_COMM_SUM, a)) return fail_from(g, "ar");
      EXPECT_EQ(y, 2 * (r - coord * stride[a]) + stride[a]);
    }
    dsc_mesh_free(m);
    return DSC_OK;
  });
  EXPECT_EQ(st, DSC_OK) << diags(ctx.ctx);
  // A shape for another world is refused naming both.
  Ctx ctx2;
  st = run_ranks(ctx2.ctx, 2, [&](dsc_comm *c) -> dsc_status {
    dsc_mesh *m = nullptr;
    dsc_status s = dsc_mesh_new(c, &shape, &m);
    EXPECT_EQ(m, nullptr);
    return s;
  });
  EXPECT_EQ(st, DSC_ERR_USER);
  EXPECT_NE(diags(ctx2.ctx).find("mesh dp=2,ep=2,tp=2: the axes multiply to 8 ranks, but the "
                                 "communicator has 2"),
            std::string::npos)
      << diags(ctx2.ctx);
}

}  // namespace
