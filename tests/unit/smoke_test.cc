#include <gtest/gtest.h>
#include "ir/ir.h"
TEST(Context, CreatesAndFrees) {
  dsc_context *ctx = dsc_context_new(nullptr, nullptr);
  ASSERT_NE(ctx, nullptr);
  dsc_context_free(ctx);
}
