"""What lets FLA's Triton kernels run under Triton's interpreter (TRITON_INTERPRET=1) on a CPU, applied from
outside, once, when the fla backend loads there. Nothing here runs on a GPU or NPU.

Three things stop them (triton 3.6, fla-core 0.6):
- the autotuner asks the active driver for its benchmarker for every kernel with several configs, and the
  interpreter has no driver ("0 active drivers"): interpreted, every config computes the same values, so the
  first is taken without timing;
- the interpreter runs `for i in range(n)` with a plain Python int as i, on which FLA's kernels call
  `i.to(tl.int64)`: the loop variable is made a Triton scalar at the top of the loop body, as an assignment
  in the kernel would be;
- `range(n)` of an interpreted scalar calls int() on a one-element array, which NumPy 2.4 refuses: the
  element is read with .item().
Each patch checks that the Triton internals it replaces exist; where they do not (a Triton that changed
them), `InterpreterSupportError` says so: bench's preflight refuses such a case in one line before any rank
starts (`support_problem`, backend fla's `interpreter_problem`), and the tests skip with that reason.
"""

from __future__ import annotations

import ast
import importlib

_APPLIED: list[str] = []


class InterpreterSupportError(RuntimeError):
    """This Triton lacks an internal the interpreter support replaces."""


def _require(module: object, name: str) -> object:
    if not hasattr(module, name):
        version = getattr(importlib.import_module("triton"), "__version__", "?")
        raise InterpreterSupportError(
            f"triton {version} has no {getattr(module, '__name__', module)}.{name}, which running FLA's "
            "kernels under TRITON_INTERPRET=1 replaces: pin the Triton the project tests with (see .ci/run)"
        )
    return getattr(module, name)


def _scalar_loop_variables(transformer: type) -> type:
    """An interpreter AST transformer that also makes every simple for-loop variable a Triton scalar."""

    class ScalarLoops(transformer):  # type: ignore[misc, valid-type]
        def visit_For(self, node: ast.For) -> ast.For:  # noqa: N802 (ast.NodeVisitor's name)
            self.generic_visit(node)
            if isinstance(node.target, ast.Name):
                name = node.target.id
                # i = interpreter_semantic.to_tensor(i, False): what the interpreter does for an assignment.
                to_tensor = ast.Attribute(
                    value=ast.Name(id="interpreter_semantic", ctx=ast.Load()),
                    attr="to_tensor",
                    ctx=ast.Load(),
                )
                call = ast.Call(
                    func=to_tensor, args=[ast.Name(id=name, ctx=ast.Load()), ast.Constant(False)], keywords=[]
                )
                node.body.insert(0, ast.Assign(targets=[ast.Name(id=name, ctx=ast.Store())], value=call))
            return node

    return ScalarLoops


def _targets() -> tuple:
    """The Triton internals the patches replace; InterpreterSupportError naming the first one missing."""
    autotuner = importlib.import_module("triton.runtime.autotuner")
    interpreter = importlib.import_module("triton.runtime.interpreter")
    tuner = _require(autotuner, "Autotuner")
    _require(tuner, "do_bench")
    rewriter = _require(interpreter, "FunctionRewriter")
    transformer = _require(interpreter, "ASTTransformer")
    _require(rewriter, "ast_transformer")
    patch_tensor = _require(interpreter, "_patch_lang_tensor")
    _require(interpreter, "InterpretedFunction")
    return interpreter, tuner, rewriter, transformer, patch_tensor


def support_problem() -> str | None:
    """Why the patches cannot apply to this Triton (InterpreterSupportError's line), or None; nothing is
    patched (bench's preflight asks, before any rank starts: Backend.interpreter_problem)."""
    if _APPLIED:
        return None
    try:
        _targets()
    except InterpreterSupportError as error:
        return str(error)
    except ImportError as error:  # a Triton without the interpreter's modules
        return f"Triton's interpreter cannot run FLA's kernels here: {error}"
    return None


def support_interpreter() -> list[str]:
    """Apply the patches (once per process); returns their names. InterpreterSupportError where this Triton
    lacks what they replace."""
    if _APPLIED:
        return list(_APPLIED)
    interpreter, tuner, rewriter, transformer, patch_tensor = _targets()

    tuner.do_bench = property(lambda self: lambda kernel_call, quantiles: [0.0] * len(quantiles))
    rewriter.ast_transformer = _scalar_loop_variables(transformer)()
    interpreter.InterpretedFunction.rewritten_fn.clear()  # rewritten before the patch: rewrite again

    def patched_tensor(tensor, scope):
        patch_tensor(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.item()))

    interpreter._patch_lang_tensor = patched_tensor
    _APPLIED.extend(["autotuner: first config", "for-loop variables as scalars", "__index__ via item()"])
    return list(_APPLIED)
