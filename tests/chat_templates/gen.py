"""Renders every template of templates.json on every conversation of it with
transformers' own Jinja environment (its _compile_jinja_template: jinja2 with
trim_blocks, lstrip_blocks, loop controls, raise_exception, its tojson) and
writes cases.json, which tests/unit/chat_template_test.cc compares dsc's
renderer with. Run with a Python that has transformers and jinja2:

    build/bench-venv/bin/python tests/chat_templates/gen.py
"""
import json
import os
import sys

import jinja2
import transformers
from transformers.utils.chat_template_utils import _compile_jinja_template

here = os.path.dirname(os.path.abspath(__file__))
spec = json.load(open(os.path.join(here, "templates.json")))
cases = []
for t in spec["templates"]:
    tpl = _compile_jinja_template(t["template"])
    for conv in spec["conversations"]:
        for gen in (False, True):
            case = {"template": t["name"], "conversation": conv["name"], "add_generation_prompt": gen}
            try:
                case["expected"] = tpl.render(messages=conv["messages"], tools=None, documents=None,
                                              add_generation_prompt=gen, bos_token=t.get("bos", ""),
                                              eos_token=t.get("eos", ""))
            except jinja2.exceptions.TemplateError as e:
                case["error"] = str(e)
            cases.append(case)
out = {"generated_by": "transformers %s, jinja2 %s" % (transformers.__version__, jinja2.__version__),
       "cases": cases}
with open(os.path.join(here, "cases.json"), "w") as f:
    json.dump(out, f, indent=2, ensure_ascii=False)
    f.write("\n")
print("%d cases, %d errors" % (len(cases), sum("error" in c for c in cases)), file=sys.stderr)
