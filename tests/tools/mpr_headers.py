"""mpr_headers.py — parse the public prototypes of api/include/mpirpc/*.h.

A small, strict parser for the header style of this project (one declaration
per statement, no macros in prototypes): comments, preprocessor lines, the
`extern "C"` guards, brace blocks (structs, enums, static inline bodies) and
typedefs are removed; every remaining statement `ret name(params);` whose name
starts with mpr_ is a public function. Used by gen_null_args.py.
"""
import re
from pathlib import Path


def _norm_type(t):
    """'const  mpr_tensor_t * const *' -> 'const mpr_tensor_t *const *'."""
    t = " ".join(t.replace("*", " * ").split())
    return t.replace("* *", "**").replace("* *", "**").replace("* const", "*const").strip()


class Param:
    def __init__(self, text):
        text = " ".join(text.split())
        fp = re.match(r"^(.*)\(\s*\*\s*(\w+)\s*\)\s*(\(.*\))$", text)
        if fp:  # inline function pointer: keep the full declarator type
            self.type = _norm_type(fp.group(1)) + " (*)" + fp.group(3)
            self.name = fp.group(2)
            return
        m = re.match(r"^(.*?)(\w+)$", text)
        if not m or text in ("void", "...") or not m.group(1).strip():
            raise ValueError(f"cannot parse parameter '{text}'")
        self.type = _norm_type(m.group(1))
        self.name = m.group(2)

    def __repr__(self):
        return f"{self.type} {self.name}"


class Function:
    def __init__(self, header, ret, name, params, variadic):
        self.header, self.ret, self.name, self.params, self.variadic = header, ret, name, params, variadic


def _strip(src):
    src = re.sub(r"/\*.*?\*/", " ", src, flags=re.S)
    src = re.sub(r"//[^\n]*", " ", src)
    src = re.sub(r"#ifdef __cplusplus.*?#endif", " ", src, flags=re.S)
    src = re.sub(r"^\s*#(?:[^\n]*\\\n)*[^\n]*", " ", src, flags=re.M)
    src = re.sub(r"__attribute__\s*\(\((?:[^()]|\([^()]*\))*\)\)", " ", src)
    # Remove brace blocks (innermost first) and what they belong to.
    prev = None
    while prev != src:
        prev = src
        src = re.sub(r"\{[^{}]*\}", " @BLOCK@ ", src)
    return src


def _split_top(text):
    """Split a parameter list at commas outside parentheses."""
    parts, depth, cur = [], 0, ""
    for ch in text:
        if ch == "," and depth == 0:
            parts.append(cur.strip())
            cur = ""
            continue
        depth += ch == "("
        depth -= ch == ")"
        cur += ch
    if cur.strip():
        parts.append(cur.strip())
    return parts


def parse_header(path):
    src = _strip(Path(path).read_text())
    funcs = []
    # A static inline function ends with its body (no ';'): cut there.
    for stmt in re.split(r";|@BLOCK@", src):
        stmt = " ".join(stmt.split())
        if not stmt or stmt.startswith("typedef") or "(" not in stmt:
            continue
        if stmt.startswith("static"):
            continue
        m = re.match(r"^(?:extern\s+)?(.*?)\b(mpr_\w+)\s*\((.*)\)$", stmt)
        if not m:
            # struct member lists are gone; anything else is unexpected
            raise ValueError(f"{path}: cannot parse statement '{stmt}'")
        ret = _norm_type(m.group(1))
        raw = _split_top(m.group(3))
        variadic = raw and raw[-1] == "..."
        if variadic:
            raw = raw[:-1]
        if raw == ["void"]:
            raw = []
        params = [Param(p) for p in raw]
        funcs.append(Function(Path(path).name, ret, m.group(2), params, variadic))
    return funcs


def parse_all(include_dir):
    funcs = []
    for h in sorted(Path(include_dir).glob("*.h")):
        funcs += parse_header(h)
    return funcs


if __name__ == "__main__":
    import sys
    for f in parse_all(sys.argv[1]):
        print(f.header, f.ret, f.name, f.params, "..." if f.variadic else "")
