// Chat templates (runtime/chat_template.c) against transformers: every
// template of tests/chat_templates/templates.json (ChatML, Llama 3, Mistral,
// Zephyr, Gemma as their tokenizer_config.json spell them, and templates
// that use the rest of the subset: namespaces, whitespace control, loop
// controls, filters, tests, slices, literals) rendered on every
// conversation, with and without the generation prompt, equal byte for
// byte to what transformers' own Jinja environment rendered
// (tests/chat_templates/cases.json, written by gen.py there), including the
// raise_exception messages; and what the subset refuses, at parse time.
#include <cjson/cJSON.h>
#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <sstream>
#include <string>

#include "dsc/dsc.h"
#include "tests/unit/test_util.h"

namespace {

std::string slurp(const std::string &path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

struct Json {
  cJSON *j;
  explicit Json(const std::string &text) : j(cJSON_Parse(text.c_str())) {}
  ~Json() { cJSON_Delete(j); }
};

const cJSON *get(const cJSON *o, const char *k) { return cJSON_GetObjectItemCaseSensitive(o, k); }

TEST(ChatTemplate, RendersAsTransformersDoes) {
  std::string dir = std::string(DSC_SOURCE_DIR) + "/tests/chat_templates/";
  Json spec(slurp(dir + "templates.json")), cases(slurp(dir + "cases.json"));
  ASSERT_NE(spec.j, nullptr);
  ASSERT_NE(cases.j, nullptr);
  dsc_context *ctx = dsc_context_new(nullptr, nullptr);
  std::map<std::string, dsc_chat_template *> tpl;
  std::map<std::string, std::string> conv;
  const cJSON *t;
  cJSON_ArrayForEach(t, get(spec.j, "templates")) {
    std::string name = get(t, "name")->valuestring;
    dsc_chat_template *ct = nullptr;
    EXPECT_EQ(dsc_chat_template_parse(ctx, get(t, "template")->valuestring,
                                      get(t, "bos")->valuestring, get(t, "eos")->valuestring, &ct),
              DSC_OK)
        << name << ": " << diags(ctx);
    dsc_diag_clear(ctx);
    tpl[name] = ct;
  }
  cJSON_ArrayForEach(t, get(spec.j, "conversations")) {
    char *m = cJSON_PrintUnformatted(get(t, "messages"));
    conv[get(t, "name")->valuestring] = m;
    free(m);
  }
  int n = 0, errors = 0;
  cJSON_ArrayForEach(t, get(cases.j, "cases")) {
    std::string tn = get(t, "template")->valuestring, cn = get(t, "conversation")->valuestring;
    bool gen = cJSON_IsTrue(get(t, "add_generation_prompt"));
    if (!tpl[tn]) continue;
    char *out = nullptr;
    size_t len = 0;
    dsc_status st = dsc_chat_template_render(tpl[tn], conv[cn].c_str(), gen, &out, &len);
    std::string what = tn + " on " + cn + (gen ? " with" : " without") + " the generation prompt";
    if (const cJSON *want = get(t, "expected")) {
      EXPECT_EQ(st, DSC_OK) << what << ": " << diags(ctx);
      if (out) {
        EXPECT_EQ(std::string(out, len), std::string(want->valuestring)) << what;
      }
    } else {
      errors++;
      EXPECT_EQ(st, DSC_ERR_USER) << what;
      std::string msg = std::string("chat template: ") + get(t, "error")->valuestring;
      EXPECT_NE(diags(ctx).find(msg), std::string::npos) << what << ": " << diags(ctx);
    }
    free(out);
    dsc_diag_clear(ctx);
    n++;
  }
  EXPECT_EQ(n, 100);
  EXPECT_EQ(errors, 10);
  for (auto &kv : tpl) dsc_chat_template_free(kv.second);
  dsc_context_free(ctx);
}

TEST(ChatTemplate, WhatTheSubsetLacksIsRefusedAtParseNamingTheLine) {
  struct Bad {
    const char *src, *msg;
  } bad[] = {
      {"{% macro f() %}x{% endmacro %}", "line 1: the statement 'macro' is not supported"},
      {"a\n{% for m in messages %}", "'endfor' is missing"},
      {"{% if x %}a{% endfor %}", "'endfor' without its opening statement"},
      {"{{ 'abc }}", "a '{{' is not closed"},  // the string runs past the closer
      {"x\n\n{{ a + }}", "line 3: expected a value, found 'end'"},
      {"{{ a b }}", "unexpected 'b'"},
      {"{% set x %}y{% endset %}", "block assignments are not supported"},
      {"{{ x", "a '{{' is not closed"},
  };
  dsc_context *ctx = dsc_context_new(nullptr, nullptr);
  for (const Bad &b : bad) {
    dsc_chat_template *t = nullptr;
    EXPECT_EQ(dsc_chat_template_parse(ctx, b.src, "", "", &t), DSC_ERR_USER) << b.src;
    EXPECT_EQ(t, nullptr);
    EXPECT_NE(diags(ctx).find(b.msg), std::string::npos) << b.src << ": " << diags(ctx);
    dsc_diag_clear(ctx);
  }
  // Errors of a render: an attribute of undefined, an unknown filter, bad messages.
  struct Run {
    const char *src, *messages, *msg;
  } runs[] = {
      {"{{ nothing.role }}", "[]", "'nothing' is undefined"},
      {"{{ messages | frobnicate }}", "[]", "the filter frobnicate is not supported"},
      {"{{ 1 / 0 }}", "[]", "division by zero"},
      {"{{ messages }}", "{\"not\": \"a list\"}", "the messages are not a JSON list"},
      {"{{ messages[0].content + 1 }}", "[{\"content\": \"a\"}]",
       "unsupported operand types for +: string and int"},
  };
  for (const Run &r : runs) {
    dsc_chat_template *t = nullptr;
    ASSERT_EQ(dsc_chat_template_parse(ctx, r.src, "", "", &t), DSC_OK) << r.src << diags(ctx);
    char *out = nullptr;
    EXPECT_EQ(dsc_chat_template_render(t, r.messages, false, &out, nullptr), DSC_ERR_USER) << r.src;
    EXPECT_EQ(out, nullptr);
    EXPECT_NE(diags(ctx).find(r.msg), std::string::npos) << r.src << ": " << diags(ctx);
    dsc_diag_clear(ctx);
    dsc_chat_template_free(t);
  }
  dsc_context_free(ctx);
}

// Every prefix of every template: parsed or refused with a message, and
// what parses renders or fails with one (the error paths, under the
// sanitizers in CI).
TEST(ChatTemplate, EveryPrefixOfEveryTemplateParsesOrIsRefused) {
  std::string dir = std::string(DSC_SOURCE_DIR) + "/tests/chat_templates/";
  Json spec(slurp(dir + "templates.json"));
  ASSERT_NE(spec.j, nullptr);
  char *msgs =
      cJSON_PrintUnformatted(get(cJSON_GetArrayItem(get(spec.j, "conversations"), 1), "messages"));
  dsc_context *ctx = dsc_context_new(nullptr, nullptr);
  int parsed = 0, refused = 0;
  const cJSON *t;
  cJSON_ArrayForEach(t, get(spec.j, "templates")) {
    std::string src = get(t, "template")->valuestring;
    for (size_t n = 0; n <= src.size(); n++) {
      dsc_chat_template *ct = nullptr;
      dsc_status st = dsc_chat_template_parse(ctx, src.substr(0, n).c_str(), "<s>", "</s>", &ct);
      ASSERT_TRUE(st == DSC_OK || st == DSC_ERR_USER) << n;
      if (st != DSC_OK) {
        EXPECT_GT(dsc_diag_count(ctx), 0);
        refused++;
      } else {
        parsed++;
        char *out = nullptr;
        st = dsc_chat_template_render(ct, msgs, true, &out, nullptr);
        EXPECT_TRUE(st == DSC_OK || st == DSC_ERR_USER);
        free(out);
        dsc_chat_template_free(ct);
      }
      dsc_diag_clear(ctx);
    }
  }
  EXPECT_GT(parsed, 100);
  EXPECT_GT(refused, 1000);
  free(msgs);
  dsc_context_free(ctx);
}

TEST(ChatTemplate, LoadsTokenizerConfigAndItsSpecialTokens) {
  std::string dir = testing::TempDir();
  std::string cfg = dir + "/dsc_chat_tokenizer_config.json";
  {
    std::ofstream f(cfg);
    f << R"({"bos_token": {"content": "<s>", "lstrip": false}, "eos_token": "</s>",
             "chat_template": [{"name": "tool_use", "template": "T"},
                               {"name": "default", "template": "{{ bos_token }}{{ messages[0].content }}{{ eos_token }}"}]})";
  }
  dsc_context *ctx = dsc_context_new(nullptr, nullptr);
  dsc_chat_template *t = nullptr;
  ASSERT_EQ(dsc_chat_template_load(ctx, cfg.c_str(), &t), DSC_OK) << diags(ctx);
  char *out = nullptr;
  ASSERT_EQ(
      dsc_chat_template_render(t, R"([{"role": "user", "content": "hi"}])", true, &out, nullptr),
      DSC_OK);
  EXPECT_STREQ(out, "<s>hi</s>");
  free(out);
  dsc_chat_template_free(t);
  {
    std::ofstream f(cfg);
    f << R"({"eos_token": "</s>"})";
  }
  EXPECT_EQ(dsc_chat_template_load(ctx, cfg.c_str(), &t), DSC_ERR_USER);
  EXPECT_NE(diags(ctx).find("no chat_template"), std::string::npos) << diags(ctx);
  dsc_context_free(ctx);
}

}  // namespace
