"""A CPU model of XLA's GPU ``SimplifyFPConversions`` pass, for tests.

On the GPU, with ``xla_allow_excess_precision`` (the default), XLA rewrites every chain of
floating-point converts ``A -> B -> C`` into ``A -> C`` (openxla/xla#41605), so
``x.astype(bf16).astype(f32)`` may return ``x`` unrounded. The CPU keeps the chain, so CPU
tests alone cannot see code that relies on such a round trip. :func:`fold_converts` evaluates a
function's jaxpr the way that pass would compile it: a float convert whose operand was itself
produced by a float convert converts the chain's origin instead. Calls (``pjit``, custom
derivatives) are followed, so chains across function boundaries fold as they do once XLA has
inlined them; ``cond``, ``scan`` and ``while`` are evaluated step by step through the same
rules (their bodies are compiled, and folded, like any other computation).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax._src import core


def _is_float(dt) -> bool:
    return jnp.issubdtype(dt, jnp.floating)


def _eval(jaxpr, consts, args, arg_origins):
    env, origin = {}, {}

    def read(v):
        return v.val if isinstance(v, core.Literal) else env[v]

    for v, c in zip(jaxpr.constvars, consts):
        env[v] = c
    for v, a, o in zip(jaxpr.invars, args, arg_origins):
        env[v] = a
        if o is not None:
            origin[v] = o
    for eqn in jaxpr.eqns:
        invals = [read(v) for v in eqn.invars]
        name = eqn.primitive.name
        if (name == "convert_element_type" and _is_float(eqn.params["new_dtype"])
                and _is_float(invals[0].dtype)):
            v = eqn.invars[0]
            src = origin.get(v, invals[0]) if not isinstance(v, core.Literal) else invals[0]
            env[eqn.outvars[0]] = jax.lax.convert_element_type(src, eqn.params["new_dtype"])
            origin[eqn.outvars[0]] = src
            continue
        sub = eqn.params.get("jaxpr") if name in ("pjit", "jit", "closed_call") else (
            eqn.params.get("call_jaxpr") if name.startswith("custom_jvp_call") else None)
        if sub is None and name.startswith("custom_vjp_call"):
            sub = eqn.params.get("call_jaxpr") or eqn.params.get("fun_jaxpr")
        if sub is not None:
            closed = sub if hasattr(sub, "jaxpr") else core.ClosedJaxpr(sub, ())
            ins = [None if isinstance(v, core.Literal) else origin.get(v) for v in eqn.invars]
            outs, outs_origin = _eval(closed.jaxpr, closed.consts, invals, ins)
            for v, o, oo in zip(eqn.outvars, outs, outs_origin):
                env[v] = o
                if oo is not None:
                    origin[v] = oo
            continue
        if name in ("cond", "scan", "while"):
            out = _control_flow(name, eqn.params, invals)
            for v, o in zip(eqn.outvars, out):
                env[v] = o
            continue
        out = eqn.primitive.bind(*invals, **eqn.params)
        for v, o in zip(eqn.outvars, out if eqn.primitive.multiple_results else [out]):
            env[v] = o
    outs = [read(v) for v in jaxpr.outvars]
    return outs, [None if isinstance(v, core.Literal) else origin.get(v)
                  for v in jaxpr.outvars]


def _run(closed, args):
    return _eval(closed.jaxpr, closed.consts, list(args), [None] * len(args))[0]


def _control_flow(name, params, invals):
    if name == "cond":
        branch = params["branches"][int(np.clip(int(invals[0]), 0,
                                               len(params["branches"]) - 1))]
        return _run(branch, invals[1:])
    if name == "while":
        nc, nb = params["cond_nconsts"], params["body_nconsts"]
        cc, bc, carry = invals[:nc], invals[nc:nc + nb], invals[nc + nb:]
        while bool(_run(params["cond_jaxpr"], cc + carry)[0]):
            carry = _run(params["body_jaxpr"], bc + carry)
        return carry
    nc, nk, length = params["num_consts"], params["num_carry"], params["length"]
    consts, carry, xs = invals[:nc], invals[nc:nc + nk], invals[nc + nk:]
    ys = []
    for i in (reversed(range(length)) if params["reverse"] else range(length)):
        out = _run(params["jaxpr"], consts + carry + [x[i] for x in xs])
        carry, y = out[:nk], out[nk:]
        ys.append(y)
    if params["reverse"]:
        ys = ys[::-1]
    n_ys = len(params["jaxpr"].jaxpr.outvars) - nk
    stacked = [jnp.stack([y[j] for y in ys]) for j in range(n_ys)] if ys else []
    return carry + stacked


def fold_converts(fn):
    """``fn`` evaluated as if XLA had folded its chains of float converts (see module doc)."""

    def wrapped(*args):
        closed, shape = jax.make_jaxpr(fn, return_shape=True)(*args)
        flat = jax.tree.leaves(args)
        outs, _ = _eval(closed.jaxpr, closed.consts, flat, [None] * len(flat))
        return jax.tree.unflatten(jax.tree.structure(shape), outs)

    return wrapped
