/* The run-knob flags of dsc train, dsc plan and dsc dump (--zero-stage,
 * --bucket-bytes, --offload-optimizer, ...): parsed and range-checked by
 * the settings table (include/dsc/settings.h), so that each flag means the
 * same in every command and as the train section's key. */
#include <string.h>

#include "tools/cli.h"

int cli_knob_flag(const char *cmd, int argc, char **argv, int *i, dsc_run_knobs *k) {
  const dsc_setting *s = dsc_setting_find_flag(argv[*i]);
  if (!s || s->knob_off < 0) return 0;
  dsc_setting_value v;
  if (*i + 1 >= argc || !dsc_setting_parse(s, argv[*i + 1], true, &v)) {
    cli_usage_error(cmd, "%s needs %s", s->flag, dsc_setting_want(s, true));
    return -1;
  }
  dsc_run_knobs_store(k, s, &v);
  ++*i;
  return 1;
}
