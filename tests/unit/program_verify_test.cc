// cg_program_verify (program/verify.c), the one check every executor runs
// on a Program before trusting it: real lowered programs (the tiny GPT's
// train step on each tier, every collective kind) pass; each kind of damage
// is refused naming the program and the instruction; the cuda executor's
// limits (no host or disk tier) refuse offloaded programs without a device;
// and no random damage crashes it.
#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "codegen/codegen.h"
#include "tests/unit/comm_test_util.h"

namespace {

// A lowered program and what it came from; copies of its arrays can be
// damaged without touching the lowering's.
struct Lowered {
  dsc_context *ctx = dsc_context_new(nullptr, nullptr);
  dsc_module *m = nullptr;
  ir_arena arena;
  cg_program *p = nullptr;
  cg_program copy;
  std::vector<cg_buffer> bufs;
  std::vector<cg_instr> ins;
  std::vector<cg_output> outs;
  std::vector<cg_assign> assigns;
  std::vector<std::vector<int>> args;

  explicit Lowered(dsc_module *(*make)(dsc_context *), const char *graph) {
    ir_arena_init(&arena, ctx);
    m = make(ctx);
    if (!m) return;
    if (cg_lower_graph(dsc_module_find_graph(m, graph), &arena, &p) != DSC_OK) p = nullptr;
    if (p) reset();
  }
  ~Lowered() {
    ir_arena_release(&arena);
    dsc_module_free(m);
    dsc_context_free(ctx);
  }
  // copy = the lowered program, with arrays of its own
  void reset() {
    copy = *p;
    bufs.assign(p->buffers, p->buffers + p->n_buffers);
    ins.assign(p->instrs, p->instrs + p->n_instrs);
    outs.assign(p->outputs, p->outputs + p->n_outputs);
    assigns.assign(p->assigns, p->assigns + p->n_assigns);
    args.clear();
    for (cg_instr &in : ins) {
      args.emplace_back(in.args, in.args + in.n_args);
      in.args = args.back().data();
    }
    copy.buffers = bufs.data();
    copy.instrs = ins.data();
    copy.outputs = outs.data();
    copy.assigns = assigns.data();
    dsc_diag_clear(ctx);
  }
  // The limits the cpu executor gives a program planned for its own arenas
  // (a disk staging arena only when `staged`).
  cg_verify_limits cpu(bool staged = false) const {
    return {{p->arena_bytes[CG_ARENA_STATE], p->tier_bytes[CG_TIER_HOST],
             staged ? p->tier_bytes[CG_TIER_DISK] : 0},
            true,
            nullptr};
  }
  cg_verify_limits cuda() const { return {{p->arena_bytes[CG_ARENA_STATE], 0, 0}, false, "cuda"}; }
  int first(cg_ins_kind k) const {
    for (int i = 0; i < copy.n_instrs; i++)
      if (ins[i].kind == k) return i;
    return -1;
  }
  bool verify(const cg_verify_limits *lim) { return cg_program_verify(ctx, &copy, lim); }
  std::string msgs() { return diags(ctx); }
};

dsc_module *device_step(dsc_context *ctx) {
  test_tiny_options o = {};
  return test_tiny_step(ctx, &o);
}
dsc_module *host_step(dsc_context *ctx) {
  test_tiny_options o = {};
  o.optimizer = DSC_OFFLOAD_HOST;
  return test_tiny_step(ctx, &o);
}
dsc_module *disk_step(dsc_context *ctx) {
  test_tiny_options o = {};
  o.optimizer = DSC_OFFLOAD_DISK;
  return test_tiny_step(ctx, &o);
}
dsc_module *collectives(dsc_context *ctx) { return comm_test::coll_module(ctx, 2, DSC_F32); }

TEST(ProgramVerify, LoweredProgramsPass) {
  Lowered d(device_step, "train_step");
  ASSERT_NE(d.p, nullptr) << d.msgs();
  cg_verify_limits cpu = d.cpu(), cuda = d.cuda();
  EXPECT_TRUE(d.verify(nullptr)) << d.msgs();
  EXPECT_TRUE(d.verify(&cpu)) << d.msgs();
  EXPECT_TRUE(d.verify(&cuda)) << d.msgs();
  ASSERT_GE(d.first(CG_INS_GEMM), 0);
  ASSERT_GE(d.first(CG_INS_EMBEDDING_GRAD), 0);
  ASSERT_GT(d.copy.n_assigns, 0);

  Lowered c(collectives, "step");
  ASSERT_NE(c.p, nullptr) << c.msgs();
  ASSERT_EQ(c.p->n_collectives, 5);
  cg_verify_limits ccpu = c.cpu(), ccuda = c.cuda();
  EXPECT_TRUE(c.verify(&ccpu)) << c.msgs();
  EXPECT_TRUE(c.verify(&ccuda)) << c.msgs();
}

// A STATE arena one byte short of the plan: the last param is outside it.
TEST(ProgramVerify, BuffersMustLieInsideTheArenasGiven) {
  Lowered d(device_step, "train_step");
  ASSERT_NE(d.p, nullptr) << d.msgs();
  cg_verify_limits lim = d.cpu();
  lim.tier_bytes[CG_TIER_DEVICE] -= 64;
  EXPECT_FALSE(d.verify(&lim));
  EXPECT_NE(d.msgs().find("program 'train_step': buffer "), std::string::npos) << d.msgs();
  EXPECT_NE(d.msgs().find("lies outside its arena"), std::string::npos) << d.msgs();
  d.reset();
  EXPECT_TRUE(d.verify(nullptr)) << d.msgs();  // no limits: the structure only
}

struct Breaker {
  const char *expect;
  std::function<void(Lowered &)> apply;
};

// Each kind of damage to a real program: refused, the message naming the
// instruction where there is one.
TEST(ProgramVerify, EachDamageIsRefusedByName) {
  Lowered d(device_step, "train_step");
  ASSERT_NE(d.p, nullptr) << d.msgs();
  int launch = d.first(CG_INS_LAUNCH), gemm = d.first(CG_INS_GEMM),
      emb = d.first(CG_INS_EMBEDDING_GRAD);
  ASSERT_GE(launch, 0);
  auto at = [](int i, const char *what) {
    return "instruction " + std::to_string(i) + ": " + what;
  };
  std::string s_launch_kernel = at(launch, "kernel 99999 does not exist"),
              s_launch_args = at(launch, "kernel '"), s_arg = at(launch, "argument 0: buffer -1"),
              s_gemm = at(gemm, "GEMM operand A reaches past buffer"),
              s_gemm_dt = at(gemm, "GEMM operands A and B have different dtypes"),
              s_emb = at(emb, "embedding gradient: sizes do not fit the buffers"),
              s_emb_ids = at(emb, "embedding gradient: ids not i32/i64"),
              s_kind = at(launch, "unknown instruction kind 77");
  const Breaker breakers[] = {
      {s_launch_kernel.c_str(), [&](Lowered &l) { l.ins[launch].kernel = 99999; }},
      {s_launch_args.c_str(), [&](Lowered &l) { l.ins[launch].n_args++; }},
      {s_arg.c_str(), [&](Lowered &l) { l.ins[launch].args[0] = -1; }},
      {s_gemm.c_str(),
       [&](Lowered &l) { l.ins[gemm].gemm.a.offset = l.bufs[l.ins[gemm].gemm.a.buffer].numel; }},
      {s_gemm_dt.c_str(),
       [&](Lowered &l) {
         int b = l.ins[gemm].gemm.b.buffer;
         l.bufs[b].dtype = l.bufs[b].dtype == DSC_F32 ? DSC_I32 : DSC_F32;  // the same size
       }},
      {s_emb.c_str(), [&](Lowered &l) { l.ins[emb].rows = 1 << 30; }},
      {s_emb_ids.c_str(), [&](Lowered &l) { l.ins[emb].ids = l.ins[emb].src; }},
      {s_kind.c_str(), [&](Lowered &l) { l.ins[launch].kind = (cg_ins_kind)77; }},
      {"buffer 0 has a bad tier 5", [&](Lowered &l) { l.bufs[0].tier = 5; }},
      {"buffer 0 is malformed", [&](Lowered &l) { l.bufs[0].numel = -1; }},
      {"output 0 does not fit its buffer", [&](Lowered &l) { l.outs[0].offset = -1; }},
      {"assign 0 (param ", [&](Lowered &l) { l.assigns[0].param = 1 << 20; }},
      {"which assign 0 overwrites",
       [&](Lowered &l) {
         l.assigns[0].in_place = false;
         l.outs[0].buffer = cg_param_buffer(&l.copy, l.assigns[0].param);
       }},
      {"negative WORK arena size", [&](Lowered &l) { l.copy.arena_bytes[CG_ARENA_WORK] = -1; }},
      {"malformed counts", [&](Lowered &l) { l.copy.n_instrs = -3; }},
  };
  cg_verify_limits lim = d.cpu();
  for (const Breaker &b : breakers) {
    d.reset();
    b.apply(d);
    EXPECT_FALSE(d.verify(&lim)) << b.expect;
    EXPECT_NE(d.msgs().find(b.expect), std::string::npos) << "want: " << b.expect << "\n"
                                                          << d.msgs();
    EXPECT_NE(d.msgs().find("program 'train_step': "), std::string::npos) << d.msgs();
  }
}

// Collectives: ids in range, each started once then waited once, counts
// that fit; the same for NULL limits (the structure is the check's, not NCCL's).
TEST(ProgramVerify, CollectivesArePairedAndFit) {
  Lowered c(collectives, "step");
  ASSERT_NE(c.p, nullptr) << c.msgs();
  int s = c.first(CG_INS_COLLECTIVE_START), w = -1;
  ASSERT_GE(s, 0);
  for (int i = s + 1; i < c.copy.n_instrs && w < 0; i++)
    if (c.ins[i].kind == CG_INS_COLLECTIVE_WAIT && c.ins[i].coll.id == c.ins[s].coll.id) w = i;
  ASSERT_GT(w, s);
  cg_verify_limits lim = c.cpu();
  std::string id = std::to_string(c.ins[s].coll.id);
  const std::string expect[] = {
      "instruction " + std::to_string(s) + ": collective 5 does not exist (5 in the program)",
      "instruction " + std::to_string(s) + ": collective " + id +
          " is waited before its start or twice",
      "collective " + id + " has no wait",
      "instruction " + std::to_string(s) +
          ": collective: malformed (world, count, kind, root or group)",
      "instruction " + std::to_string(s) + ": collective: ",
      "instruction " + std::to_string(s) +
          ": collective: malformed (world, count, kind, root or group)",
  };
  std::function<void(Lowered &)> breaks[] = {
      [&](Lowered &l) { l.ins[s].coll.id = 5; },
      [&](Lowered &l) { std::swap(l.ins[s], l.ins[w]); },
      [&](Lowered &l) {
        l.ins[w].kind = CG_INS_COPY, l.ins[w].numel = 0, l.ins[w].src_offset = 0,
        l.ins[w].dst_offset = 0, l.ins[w].src_rank_chunk = false;
      },
      [&](Lowered &l) { l.ins[s].coll.world = 0; },
      [&](Lowered &l) { l.ins[s].coll.count = l.bufs[l.ins[s].dst].numel * 8; },
      [&](Lowered &l) { memset(l.ins[s].coll.group, 'x', sizeof l.ins[s].coll.group); },
  };
  for (size_t k = 0; k < sizeof expect / sizeof *expect; k++) {
    for (const cg_verify_limits *l :
         {(const cg_verify_limits *)&lim, (const cg_verify_limits *)nullptr}) {
      c.reset();
      breaks[k](c);
      EXPECT_FALSE(c.verify(l)) << expect[k];
      EXPECT_NE(c.msgs().find(expect[k]), std::string::npos) << "want: " << expect[k] << "\n"
                                                             << c.msgs();
    }
  }
}

// The host and disk tiers: sound under the cpu executor's limits; the cuda
// executor's (no offload) refuse them by buffer, before any device exists.
TEST(ProgramVerify, OffloadedProgramsNeedABackendWithTiers) {
  for (auto make : {host_step, disk_step}) {
    Lowered o(make, "train_step");
    ASSERT_NE(o.p, nullptr) << o.msgs();
    cg_verify_limits cpu = o.cpu(), staged = o.cpu(true), cuda = o.cuda();
    EXPECT_TRUE(o.verify(&cpu)) << o.msgs();
    EXPECT_TRUE(o.verify(&staged)) << o.msgs();
    EXPECT_FALSE(o.verify(&cuda));
    std::string tier = make == host_step ? "host" : "disk";
    EXPECT_NE(o.msgs().find("backend cuda: program 'train_step': buffer "), std::string::npos)
        << o.msgs();
    EXPECT_NE(o.msgs().find(" is on the " + tier +
                            " tier; this backend keeps every buffer on the device"),
              std::string::npos)
        << o.msgs();
  }
}

// A streamed disk value has no memory: no instruction, output or assign may
// address it; with a staging arena it may. Disk transfers pair like
// collectives and name a disk value of their buffer's size.
TEST(ProgramVerify, StreamedDiskValuesAreNeverAddressed) {
  Lowered o(disk_step, "train_step");
  ASSERT_NE(o.p, nullptr) << o.msgs();
  ASSERT_GT(o.p->n_tier_ios, 0);
  int t = o.first(CG_INS_TIER_START), launch = o.first(CG_INS_LAUNCH);
  ASSERT_GE(t, 0);
  int disk = cg_param_buffer(&o.copy, o.ins[t].tier.param);
  ASSERT_GE(disk, 0);
  ASSERT_EQ(o.bufs[disk].tier, CG_TIER_DISK);
  cg_verify_limits streamed = o.cpu(), staged = o.cpu(true);
  // a kernel argument pointed at the disk value (the kernel's argument
  // table given its dtype and size, so only the tier is wrong)
  std::vector<cg_kernel_info> kinfo(o.p->kernel_info, o.p->kernel_info + o.p->n_kernels);
  std::vector<cg_kernel_arg> kargs(
      kinfo[o.ins[launch].kernel].args,
      kinfo[o.ins[launch].kernel].args + kinfo[o.ins[launch].kernel].n_args);
  kargs[0] = {o.bufs[disk].dtype, o.bufs[disk].numel, kargs[0].read, kargs[0].written};
  kinfo[o.ins[launch].kernel].args = kargs.data();
  o.copy.kernel_info = kinfo.data();
  o.ins[launch].args[0] = disk;
  EXPECT_FALSE(o.verify(&streamed));
  EXPECT_NE(o.msgs().find("instruction " + std::to_string(launch) + ": argument 0: buffer " +
                          std::to_string(disk) + " is on the disk tier (streamed, no memory)"),
            std::string::npos)
      << o.msgs();
  dsc_diag_clear(o.ctx);
  EXPECT_TRUE(o.verify(&staged)) << o.msgs();

  // a disk transfer of a param that does not exist; one started twice
  o.reset();
  o.ins[t].tier.param = -7;
  EXPECT_FALSE(o.verify(&streamed));
  EXPECT_NE(o.msgs().find("disk transfer: param -7 is not a disk value of its buffer's size"),
            std::string::npos)
      << o.msgs();
  o.reset();
  int tw = -1;
  for (int i = t + 1; i < o.copy.n_instrs && tw < 0; i++)
    if (o.ins[i].kind == CG_INS_TIER_WAIT && o.ins[i].tier.id == o.ins[t].tier.id) tw = i;
  ASSERT_GT(tw, t);
  o.ins[tw].kind = CG_INS_TIER_START;
  EXPECT_FALSE(o.verify(&streamed));
  EXPECT_NE(
      o.msgs().find("disk transfer " + std::to_string(o.ins[t].tier.id) + " is started twice"),
      std::string::npos)
      << o.msgs();
}

// Random damage to one field of a real program: refused or accepted, never
// a crash or an out-of-bounds read (the sanitizer build runs this too).
TEST(ProgramVerify, RandomDamageNeverCrashes) {
  for (auto make : {device_step, disk_step, collectives}) {
    Lowered o(make, make == collectives ? "step" : "train_step");
    ASSERT_NE(o.p, nullptr) << o.msgs();
    std::mt19937 rng(1234);
    const int64_t odd[] = {-1, 0, 1, 3, 7, 1 << 20, INT32_MAX, INT64_MAX, INT64_MIN};
    int refused = 0, tries = 3000;
    for (int k = 0; k < tries; k++) {
      o.reset();
      int64_t v = rng() % 3 == 0 ? odd[rng() % 9] : (int64_t)(rng() % 64) - 8;
      int i = (int)(rng() % o.copy.n_instrs);
      cg_instr &in = o.ins[i];
      cg_buffer &b = o.bufs[rng() % o.bufs.size()];
      switch (rng() % 16) {
        case 0:
          in.kind = (cg_ins_kind)(v & 15);
          break;
        case 1:
          in.kernel = (int)v;
          break;
        case 2:
          if (in.n_args) in.args[rng() % in.n_args] = (int)v;
          break;
        case 3:
          in.src = (int)v;
          break;
        case 4:
          in.dst = (int)v;
          break;
        case 5:
          in.numel = v;
          break;
        case 6:
          in.src_offset = v;
          break;
        case 7:
          in.coll.id = (int)v, in.tier.id = (int)v;
          break;
        case 8:
          in.coll.count = v;
          break;
        case 9:
          in.coll.world = v;
          break;
        case 10:
          in.gemm.a.offset = v, in.gemm.m = v;
          break;
        case 11:
          in.gemm.b.buffer = (int)v;
          break;
        case 12:
          b.numel = v;
          break;
        case 13:
          b.offset = v;
          break;
        case 14:
          b.tier = (int)v, b.dtype = (dsc_dtype)(v & 31);
          break;
        case 15:
          in.tier.param = (int)v, in.ids = (int)v;
          break;
      }
      cg_verify_limits lim = o.cpu(rng() & 1);
      if (!o.verify(rng() % 4 ? &lim : nullptr)) refused++;
    }
    EXPECT_GT(refused, tries / 4);  // most damage is caught
  }
}

}  // namespace
