#!/usr/bin/env python3
"""gen_null_args.py — generate the NULL-argument table of tests/unit/test_null_args.c
from the public headers (api/include/mpirpc/*.h).

For every public function and every pointer parameter (function pointers
included) it emits one case that calls the function with NULL in that
parameter and a valid fixture in every other one, and one case per function
with every pointer NULL (run before mpr_init). The contract checked
(runtime/mpri_args.h):
  - returns mpr_err_t: MPR_ERR_INVALID_ARG, detail names function and argument;
  - returns a pointer: NULL and that error (mpr_rpc_async-like functions
    instead return a future failed with it);
  - returns anything else: the error is set (the value is the documented
    default); releases/destroys (void ..._release/_destroy): a no-op;
  - every output parameter given is cleared (NULL / 0; worker rank -1).
A parameter where NULL has a documented meaning is listed in NULL_OK with the
reason; the case still runs (it must not crash) but is not held to the error.
A header type this script does not know stops the build, so a new function
cannot slip through untested.

usage: gen_null_args.py <include dir> <output .inc>
"""
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import mpr_headers  # noqa: E402

# (function, parameter) -> why NULL is fine there.
NULL_OK = {
    ("mpr_trace_flush", "path"): "NULL means <prefix>.json",
    ("mpr_trace_write_rank", "path"): "NULL means <prefix>.rank<r>.json",
    ("mpr_register_module_kind", "user_data"): "user data may be NULL",
    ("mpr_remote_module_create", "args"): "a module kind may take no arguments",
    ("mpr_dist_context_set_current", "prev"): "NULL: the previous context is not wanted",
    ("mpr_backward", "grad"): "NULL means 1 for a one-element root",
    ("mpr_set_grad", "grad"): "NULL drops the gradient",
    ("mpr_zero_grad", "t"): "documented to accept NULL",
    ("mpr_mnist_load", "dir"): "NULL means the default dataset directory",
    ("mpr_batch_iter_create", "labels"): "labels are optional",
    ("mpr_batch_iter_next", "y"): "NULL when there are no labels",
    ("mpr_error_set", "fmt"): "NULL records the code's own text",
    ("mpr_future_set_result", "value"): "NULL means none",
    ("mpr_future_set_error", "message"): "NULL means the code's text",
    ("mpr_future_then", "user_data"): "opaque user data",
    ("mpr_init", "opts"): "NULL means the defaults",
    ("mpr_optimizer_state_export", "prefix"): "NULL means no prefix",
    ("mpr_optimizer_state_import", "prefix"): "NULL means no prefix",
    ("mpr_dist_optimizer_state_export", "prefix"): "NULL means no prefix",
    ("mpr_dist_optimizer_state_import", "prefix"): "NULL means no prefix",
    ("mpr_module_create", "ctx"): "opaque user data",
    ("mpr_module_create", "ctx_free"): "nothing to free",
    ("mpr_module_parameter", "name"): "the name is optional",
    ("mpr_lstm_forward", "h0"): "zeros",
    ("mpr_lstm_forward", "c0"): "zeros",
    ("mpr_lstm_forward", "out"): "output not wanted",
    ("mpr_lstm_forward", "hn"): "output not wanted",
    ("mpr_lstm_forward", "cn"): "output not wanted",
    ("mpr_conv2d", "bias"): "no bias",
    ("mpr_linear", "b"): "no bias",
    ("mpr_max_dim", "indices_out"): "indices not wanted",
    ("mpr_register_function", "user_data"): "opaque user data",
    ("mpr_register_async_function", "user_data"): "opaque user data",
    ("mpr_rpc_sync", "args"): "no arguments",
    ("mpr_rpc_async", "args"): "no arguments",
    ("mpr_remote", "args"): "no arguments",
    ("mpr_rref_rpc_sync", "args"): "no arguments",
    ("mpr_rref_rpc_async", "args"): "no arguments",
    ("mpr_rref_remote", "args"): "no arguments",
    ("mpr_register_type", "destructor"): "nothing to run",
    ("mpr_value_get_object", "type"): "any type",
    ("mpr_rref_self", "type"): "any type",
    ("mpr_tensor_npy_decode", "what"): "default source name",
    ("mpr_safetensors_decode", "what"): "default source name",
    ("mpr_call_sync", "result"): "the result is dropped",
}
# Every mpr_generator_t * parameter: NULL is the process-wide default generator.
NULL_OK_TYPES = {"mpr_generator_t *": "the default generator"}
# Calls that must not run with NULL there (side effects outside the test).
SKIP = {
    ("mpr_init", "opts"): "would initialize the runtime",
    ("mpr_mnist_load", "dir"): "would load the whole dataset",
}
# Parameters that take ownership of what is passed, also on failure: a fresh one.
CONSUMES = {("mpr_future_set_result", "value"): "mpr_value_retain(fx.v)",
            ("mpr_value_list_append", "item"): "mpr_value_retain(fx.v)",
            ("mpr_module_add_child", "child"): "mpr_relu_create()",
            ("mpr_sequential_append", "child"): "mpr_relu_create()",
            ("mpr_rpc_sync_take", "args"): "mpr_value_retain(fx.v)",
            ("mpr_rpc_async_take", "args"): "mpr_value_retain(fx.v)",
            ("mpr_rpc_oneway_take", "args"): "mpr_value_retain(fx.v)"}
# Fixtures chosen by parameter name (before the type's): an empty format packs nothing.
BY_NAME = {"fmt": '""'}
# Pointer-returning functions that report errors through a failed future.
FUTURE_ERRORS = {"mpr_remote_module_forward_async", "mpr_rpc_async", "mpr_rref_rpc_async", "mpr_rpc_async_take", "mpr_call_async"}
# Pointer results that are borrowed (never released by the test).
BORROWED_RESULTS = {"mpr_remote_module_get_module_rref", "mpr_module_parameter", "mpr_value_list_get", "mpr_tensor_grad",
                    "mpr_module_get_parameter", "mpr_module_child", "mpr_sequential_child",
                    "mpr_optimizer_param", "mpr_tensor_dict_get", "mpr_tensor_dict_tensor",
                    "mpr_type_find", "mpr_call_caller", "mpr_call_user_data", "mpr_module_ctx",
                    "mpr_tensor_data", "mpr_tensor_shape", "mpr_tensor_strides", "mpr_scope_escape",
                    "mpr_scope_adopt", "mpr_value_retain_borrowed"}

# Input fixtures (expressions over the test's `fx`).
INPUTS = {
    "mpr_tensor_t *": "fx.t", "const mpr_tensor_t *": "fx.t",
    "mpr_tensor_t *const *": "fx.tarr",
    "const char *": "fx.str", "const char *const *": "fx.names",
    "const int *": "fx.dims", "const int64_t *": "fx.shape",
    "mpr_batch_iter_t *": "fx.it", "const mpr_batch_iter_t *": "fx.it",
    "const mpr_call_ctx_t *": None,  # only exists inside a handler
    "mpr_future_t *": "fx.f", "const mpr_future_t *": "fx.f", "mpr_future_t *const *": "fx.farr",
    "const mpr_init_options_t *": "&fx.opts", "mpr_init_options_t *": "&fx.opts",
    "mpr_module_t *": "fx.m", "const mpr_module_t *": "fx.m", "struct mpr_module *": "fx.m",
    "mpr_optimizer_t *": "fx.opt", "const mpr_optimizer_t *": "fx.opt",
    "mpr_rref_t *": "fx.r", "const mpr_rref_t *": "fx.r", "mpr_rref_t *const *": "fx.rarr",
    "mpr_dist_optimizer_t *": "fx.dopt", "const mpr_dist_optimizer_t *": "fx.dopt",
    "mpr_remote_module_t *": "fx.rm", "const mpr_remote_module_t *": "fx.rm",
    "mpr_module_ctor_t": "fx_ctor",
    "const mpr_sgd_options_t *": "&fx.sgd",
    "const mpr_optim_options_t *": "&fx.optim",
    "mpr_lr_scheduler_t *": "fx.sched", "const mpr_lr_scheduler_t *": "fx.sched",
    "mpr_tensor_dict_t *": "fx.d", "const mpr_tensor_dict_t *": "fx.d",
    "const mpr_type_t *": "fx.type",
    "mpr_value_t *": "fx.v", "const mpr_value_t *": "fx.v",
    "const mpr_worker_info_t *": "&fx.w",
    "const void *": "fx.buf", "void *": "fx.buf", "char *": "fx.buf",
    "mpr_debug_info_t *": "&fx.dbg",
    "mpr_generator_t *": "fx.gen",
    "mpr_fn_t": "fx_fn", "mpr_async_fn_t": "fx_async_fn", "mpr_then_fn_t": "fx_then",
    "mpr_destructor_t": "fx_dtor", "mpr_module_forward_fn": "fx_forward",
    "void (*)(void *ctx)": "fx_dtor",
}
# Outputs: C type of the variable, preset, check that it was cleared, release.
OUTPUTS = {
    "mpr_tensor_t **": ("mpr_tensor_t *", "FX_SENTINEL(mpr_tensor_t *)", "{v} == NULL", "mpr_tensor_release"),
    "mpr_tensor_t ***": ("mpr_tensor_t **", "FX_SENTINEL(mpr_tensor_t **)", "{v} == NULL", None),
    "mpr_value_t **": ("mpr_value_t *", "FX_SENTINEL(mpr_value_t *)", "{v} == NULL", "mpr_value_release"),
    "mpr_rref_t **": ("mpr_rref_t *", "FX_SENTINEL(mpr_rref_t *)", "{v} == NULL", "mpr_rref_release"),
    "mpr_rref_t ***": ("mpr_rref_t **", "FX_SENTINEL(mpr_rref_t **)", "{v} == NULL", None),
    "const mpr_type_t **": ("const mpr_type_t *", "FX_SENTINEL(const mpr_type_t *)", "{v} == NULL", None),
    "const char **": ("const char *", "FX_SENTINEL(const char *)", "{v} == NULL", None),
    "const void **": ("const void *", "FX_SENTINEL(const void *)", "{v} == NULL", None),
    "void **": ("void *", "FX_SENTINEL(void *)", "{v} == NULL", None),
    "bool *": ("bool", "true", "{v} == false", None),
    "double *": ("double", "7.0", "{v} == 0.0", None),
    "int *": ("int", "7", "{v} == 0", None),
    "int64_t *": ("int64_t", "7", "{v} == 0", None),
    "size_t *": ("size_t", "7", "{v} == 0", None),
    "mpr_function_stats_t **": ("mpr_function_stats_t *", "FX_SENTINEL(mpr_function_stats_t *)", "{v} == NULL", "free"),
    "mpr_peer_stats_t **": ("mpr_peer_stats_t *", "FX_SENTINEL(mpr_peer_stats_t *)", "{v} == NULL", "free"),
    "mpr_optim_options_t *": ("mpr_optim_options_t", "{.lr = 7}", "{v}.lr == 0.0", None),
    "mpr_worker_info_t *": ("mpr_worker_info_t", "FX_STALE_WORKER", "{v}.rank == -1 && {v}.name[0] == '\\0'", None),
}
SCALARS = {"bool": "false", "double": "0.01", "int": "1", "int64_t": "1", "size_t": "1",
           "uint64_t": "1", "mpr_dtype_t": "MPR_F32", "mpr_err_t": "MPR_ERR_REMOTE",
           "mpr_value_kind_t": "MPR_VALUE_INT", "mpr_dest_t": "mpr_to_rank(0)"}
# Owned pointer results of calls that may succeed (NULL_OK cases): how to release.
RELEASE_RESULT = {"mpr_tensor_t *": "mpr_tensor_release", "mpr_value_t *": "mpr_value_release",
                  "mpr_future_t *": "mpr_future_release", "mpr_rref_t *": "mpr_rref_release",
                  "mpr_module_t *": "mpr_module_destroy",
                  "mpr_dist_optimizer_t *": "mpr_dist_optimizer_destroy",
                  "mpr_remote_module_t *": "mpr_remote_module_destroy", "mpr_optimizer_t *": "mpr_optimizer_destroy",
                  "mpr_lr_scheduler_t *": "mpr_lr_scheduler_destroy",
                  "mpr_batch_iter_t *": "mpr_batch_iter_destroy",
                  "mpr_tensor_dict_t *": "mpr_tensor_dict_destroy",
                  "mpr_generator_t *": "mpr_generator_destroy"}


def is_pointer(ptype):
    return ptype.endswith("*") or ptype in ("mpr_fn_t", "mpr_async_fn_t", "mpr_then_fn_t",
                                            "mpr_destructor_t", "mpr_module_forward_fn", "mpr_module_ctor_t") \
        or "(*)" in ptype


def null_ok(f, p):
    return (f.name, p.name) in NULL_OK or p.type in NULL_OK_TYPES


def is_release(f):
    return f.ret == "void" and (f.name.endswith("_release") or f.name.endswith("_destroy"))


def kind_of_return(f):
    if f.ret == "mpr_err_t":
        return "ERR"
    if f.name in FUTURE_ERRORS:
        return "FUTURE"
    if f.ret == "void":
        return "RELEASE" if is_release(f) else "VOID"
    if f.ret.endswith("*") and f.ret not in ("const char *", "char *"):
        return "PTR"
    return "VALUE"


def fail(msg):
    sys.stderr.write(f"gen_null_args.py: {msg}\n")
    sys.exit(1)


def emit_case(out, idx, f, null_params, phase):
    """null_params: names given NULL. phase: 'running' or 'uninit'."""
    lines = []
    args = []
    outputs = []
    for i, p in enumerate(f.params):
        if p.name in null_params:
            if p.type in OUTPUTS or is_pointer(p.type):
                args.append(f"FX_NULL({p.type if '(*)' not in p.type else 'void (*)(void *)'})")
            continue
        if p.type in SCALARS:
            args.append(SCALARS[p.type])
        elif p.type in OUTPUTS:
            ctype, preset, _, _ = OUTPUTS[p.type]
            var = f"o{i}"
            lines.append(f"    {ctype} {var} = {preset};")
            args.append(f"&{var}")
            outputs.append((var, p))
        elif p.type in INPUTS:
            expr = INPUTS[p.type]
            if expr is None:
                fail(f"{f.name}: no fixture for '{p.type} {p.name}' (only NULL can be passed)")
            if p.name in BY_NAME and p.type == "const char *":
                expr = BY_NAME[p.name]
            if (f.name, p.name) in CONSUMES:
                expr = CONSUMES[(f.name, p.name)]
            args.append(expr)
        else:
            fail(f"{f.header}: {f.name}: unknown parameter type '{p.type}' of '{p.name}': "
                 "add a fixture to tests/tools/gen_null_args.py")
    if f.variadic:
        pass  # nothing beyond the fixed parameters
    kind = kind_of_return(f)
    strict = [p for p in f.params if p.name in null_params and not null_ok(f, p)]
    call = f"{f.name}({', '.join(args)})"
    body = ["    fx_before_call();"]
    if f.ret == "void":
        body.append(f"    {call};")
        res = "0"
    elif f.ret == "mpr_err_t":
        body.append(f"    mpr_err_t rc = {call};")
        body.append("    (void)rc;")
        res = "rc"
    elif f.ret.endswith("*"):
        body.append(f"    {f.ret} p = {call};")
        res = "p != NULL"
    else:
        body.append(f"    {f.ret} v = {call};")
        body.append("    (void)v;")
        res = "0"
    arg_name = strict[0].name if len(strict) == 1 else ""
    if strict:
        if kind == "ERR":
            body.append(f'    fx_expect_err(c, rc, "{f.name}", "{arg_name}");')
        elif kind == "FUTURE":
            body.append(f'    fx_expect_failed_future(c, p, "{f.name}", "{arg_name}");')
        elif kind == "PTR":
            body.append(f'    fx_expect_null(c, p != NULL, "{f.name}", "{arg_name}");')
        elif kind == "RELEASE":
            body.append("    fx_expect_noop(c);")
        else:
            body.append(f'    fx_expect_error_set(c, "{f.name}", "{arg_name}");')
    for var, p in outputs:
        _, _, check, _ = OUTPUTS[p.type]
        if strict:
            body.append(f'    fx_expect(c, {check.format(v=var)}, "output \'{p.name}\' not cleared on failure");')
    # clean up whatever a call that succeeded handed out
    if f.ret.endswith("*") and f.ret in RELEASE_RESULT and f.name not in BORROWED_RESULTS:
        body.append(f"    if (p) {RELEASE_RESULT[f.ret]}(p);")
    elif f.ret.endswith("*"):
        body.append("    (void)p;")
    for var, p in outputs:
        rel = OUTPUTS[p.type][3]
        if rel:
            body.append(f"    if ({var} && !FX_IS_SENTINEL({var})) {rel}({var});")
    del res
    label = ",".join(sorted(null_params))
    out.append(f"/* {f.header}: {f.name} with NULL {label} */")
    out.append(f"static void null_case_{idx}(fx_case_t *c) {{")
    out.extend(lines)
    out.extend(body)
    out.append("}")
    return (idx, f.name, label, phase, bool(strict))


def main():
    if len(sys.argv) != 3:
        fail("usage: gen_null_args.py <include dir> <output>")
    funcs = mpr_headers.parse_all(sys.argv[1])
    out = [f"/* Generated by tests/tools/gen_null_args.py from {len(funcs)} public functions. "
           "Do not edit. */"]
    table = []
    idx = 0
    names = {f.name for f in funcs}
    for f in funcs:
        if any(p.type == "va_list" for p in f.params):
            # tested through its variadic twin (mpr_args_vunpack -> mpr_args_unpack)
            twin = re.sub(r"_v([a-z]+)$", r"_\1", f.name)
            if twin not in names:
                fail(f"{f.name} takes a va_list and has no variadic twin to test it through")
            continue
        ptrs = [p for p in f.params if is_pointer(p.type)]
        for p in ptrs:
            if (f.name, p.name) in SKIP:
                continue
            table.append(emit_case(out, idx, f, {p.name}, "running"))
            idx += 1
        if ptrs and not any((f.name, p.name) in SKIP for p in ptrs):
            table.append(emit_case(out, idx, f, {p.name for p in ptrs}, "uninit"))
            idx += 1
    out.append("static const fx_table_entry_t null_cases[] = {")
    for i, name, label, phase, strict in table:
        out.append(f'    {{null_case_{i}, "{name}", "{label}", FX_{phase.upper()}, {str(strict).lower()}}},')
    out.append("};")
    out.append(f"#define NULL_CASE_COUNT {len(table)}")
    out.append(f"#define NULL_FUNCTION_COUNT {len(funcs)}")
    Path(sys.argv[2]).write_text("\n".join(out) + "\n")


if __name__ == "__main__":
    main()
