#!/usr/bin/env python3
"""gen_oom_cases.py — generate the case table of tests/unit/test_oom_paths.c
from the public headers (api/include/mpirpc/*.h).

One case per public function that returns a pointer: the function called
with a valid fixture in every argument (the fixtures and their types are
gen_null_args.py's), its result checked by the harness while allocations on
the calling thread fail one after another. The contract checked: a NULL
result comes with the error set (mpr_last_error_code() != MPR_OK and a
message); for mpr_rpc_async-like functions, a NULL future likewise. Functions
whose NULL result is a documented value, not a failure, are listed in
NULL_IS_VALUE (they are still called: nothing may crash or leak). A header
type this script does not know stops the build.

usage: gen_oom_cases.py <include dir> <output .inc>
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gen_null_args as g  # noqa: E402
import mpr_headers  # noqa: E402

# function -> why NULL is a value there (documented in its header).
NULL_IS_VALUE = {
    "mpr_grad_fn_name": "NULL for a leaf",
    "mpr_tensor_grad": "NULL when no gradient was accumulated",
    "mpr_module_ctx": "NULL for a built-in module",
    "mpr_tensor_dict_get_meta": "NULL when the key is absent",
}
# Arguments of variadic functions (the fixed ones are generated).
VARARGS = {
    "mpr_value_list_of": ("2", "mpr_value_new_int(1), mpr_value_new_string(\"two\")"),
}
# Argument expressions for these (function, parameter) pairs instead of the type's fixture.
ARG = {
    ("mpr_value_new_object", "obj"): "&oom_object",  # not fx.buf: the value owns it (a no-op destructor)
    ("mpr_module_create", "ctx"): "NULL",
    ("mpr_value_pack", "fmt"): '"[ls]"',  # with VARARGS below
    ("mpr_args_pack", "fmt"): '"ld"',
    ("mpr_call_async", "fmt"): '"l"',
    ("mpr_sequential_child", "i"): "0",
    ("mpr_module_child", "name"): '"weight"',
    ("mpr_tensor_dict_get", "name"): '"t"',
    ("mpr_tensor_dict_get_meta", "key"): '"k"',
    ("mpr_type_find", "name"): '"null_args_type"',
    ("mpr_value_list_get", "i"): "0",
    ("mpr_rpc_async", "fn"): '"oom_echo"',
    ("mpr_rpc_async_take", "fn"): '"oom_echo"',
    ("mpr_call_async", "fn"): '"oom_echo"',
    ("mpr_remote", "fn"): '"oom_echo"',
    ("mpr_rref_rpc_async", "fn"): '"oom_echo"',
    ("mpr_rref_remote", "fn"): '"oom_echo"',
    ("mpr_safetensors_decode", "buf"): "oom_safetensors_bytes",
    ("mpr_safetensors_decode", "len"): "oom_safetensors_len",
    ("mpr_tensor_npy_decode", "buf"): "oom_npy_bytes",
    ("mpr_tensor_npy_decode", "len"): "oom_npy_len",
    ("mpr_tensor_load_npy", "path"): "oom_npy_path",
    ("mpr_safetensors_load", "path"): "oom_safetensors_path",
}
VARARGS.update({
    "mpr_value_pack": ("", "(int64_t)3, \"s\""),
    "mpr_args_pack": ("", "(int64_t)4, 2.5"),
    "mpr_call_async": ("", "(int64_t)5"),
})
# Results the caller owns here although gen_null_args.py treats them as borrowed
# (with no scope open, mpr_scope_escape hands the caller a reference).
OWNED = {"mpr_scope_escape"}
# Functions that cannot run here (need a handler's call context, or take a va_list).
SKIP_TYPES = {"const mpr_call_ctx_t *", "va_list"}


def returns_pointer(f):
    return f.ret.endswith("*")


def emit(out, idx, f):
    lines, args, outputs = [], [], []
    for i, p in enumerate(f.params):
        if (f.name, p.name) in ARG:
            args.append(ARG[(f.name, p.name)])
        elif p.name == "timeout_s":
            args.append("30")  # long enough for a call to self to finish
        elif p.type in g.SCALARS:
            args.append(g.SCALARS[p.type])
        elif p.type in g.OUTPUTS:
            ctype, preset, _, rel = g.OUTPUTS[p.type]
            lines.append(f"    {ctype} o{i} = {preset};")
            args.append(f"&o{i}")
            outputs.append((f"o{i}", rel))
        elif p.type in g.INPUTS and g.INPUTS[p.type] is not None:
            expr = g.INPUTS[p.type]
            if p.name in g.BY_NAME and p.type == "const char *":
                expr = g.BY_NAME[p.name]
            if (f.name, p.name) in g.CONSUMES:
                expr = g.CONSUMES[(f.name, p.name)]
            args.append(expr)
        else:
            g.fail(f"{f.header}: {f.name}: unknown parameter type '{p.type}' of '{p.name}': "
                   "add a fixture to tests/tools/gen_null_args.py")
    if f.variadic:
        if f.name not in VARARGS:
            g.fail(f"{f.name} is variadic: give its arguments in VARARGS (tests/tools/gen_oom_cases.py)")
        first, rest = VARARGS[f.name]
        if first:
            args[0] = first
        args.append(rest)
    call = f"{f.name}({', '.join(a for a in args if a)})"
    body = ["    oom_before_call();", f"    {f.ret} p = {call};"]
    value_ok = "true" if f.name in NULL_IS_VALUE else "false"
    body.append(f'    oom_check_result(c, p != NULL, {value_ok});')
    if f.name in g.FUTURE_ERRORS:
        body.append("    oom_check_future(c, p);")
    if f.ret in g.RELEASE_RESULT and (f.name not in g.BORROWED_RESULTS or f.name in OWNED):
        body.append(f"    {g.RELEASE_RESULT[f.ret]}(p);")
    else:
        body.append("    (void)p;")
    for var, rel in outputs:
        if rel:
            body.append(f"    if ({var} && !FX_IS_SENTINEL({var})) {rel}({var});")
    out.append(f"/* {f.header}: {f.name} */")
    out.append(f"static void oom_case_{idx}(oom_case_t *c) {{")
    out.extend(lines)
    out.extend(body)
    out.append("}")
    return idx, f.name


def main():
    if len(sys.argv) != 3:
        g.fail("usage: gen_oom_cases.py <include dir> <output>")
    funcs = mpr_headers.parse_all(sys.argv[1])
    out = [f"/* Generated by tests/tools/gen_oom_cases.py from {len(funcs)} public functions. Do not edit. */"]
    table, skipped = [], 0
    for f in funcs:
        if not returns_pointer(f):
            continue
        if any(p.type in SKIP_TYPES for p in f.params):
            skipped += 1
            continue
        table.append(emit(out, len(table), f))
    out.append("static const oom_table_entry_t oom_cases[] = {")
    for i, name in table:
        out.append(f'    {{oom_case_{i}, "{name}"}},')
    out.append("};")
    out.append(f"#define OOM_CASE_COUNT {len(table)}")
    out.append(f"#define OOM_SKIPPED_COUNT {skipped}")
    Path(sys.argv[2]).write_text("\n".join(out) + "\n")


if __name__ == "__main__":
    main()
