"""How far a float32 implementation of a training step may land from
exact arithmetic, element by element: the tolerance of cnnc's checkpoint
test (codegen/trainergen/torch_test.go, TestCheckpointInPyTorch, which
states the derivation; each rule below names its formula).

In:  a PyTorch model in float64 whose parameters and optimizer state are
     float32 numbers (its graph is traced with torch.fx: every node needs a
     rule here, or Analysis refuses the model), a batch, and the
     torch.optim optimizer that trains it.
Out: for one step, bounds on |x32 - x| for every activation (forward),
     every gradient (backward) and, through the optimizer's arithmetic,
     every parameter and state element after the step; the loss's bound and
     how many predictions float32 may flip.

First order in the unit roundoff u = 2^-24 (terms in u^2 are below 1e-7 of
those kept); the magnitudes are the float64 step's, the truth the bound is
measured from. A sum's own rounding is bounded for every summation order,
with or without FMA (gamma_sum). Nothing here depends on another library's
float32 result.
"""
import math

import torch
import torch.fx
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.grad import conv2d_input, conv2d_weight

U = 2.0 ** -24  # float32 unit roundoff (round to nearest)
EXP_ULPS = 2  # expf, logf: at most 2 ulp (CUDA's documented maximum; glibc's is below 1)
LAMBDA = 10.0  # the probabilistic bound's confidence (gamma_sum)


def gamma(n):
    """Higham's gamma_n: the worst-case relative error of n chained roundings."""
    return n * U / (1 - n * U)


def gamma_sum(n):
    """The error of a sum of n terms (or a dot product), relative to the sum
    of their magnitudes: the smaller of the worst case gamma_n and Higham
    and Mary's probabilistic bound exp(LAMBDA sqrt(n) u + n u^2/(1-u)) - 1
    (SIAM J. Sci. Comput. 41(5), 2019, Theorem 3.1), which holds with
    probability at least 1 - 2n exp(-LAMBDA^2 (1-u)^2 / 2) when rounding
    errors are independent and of mean zero, in any summation order. With
    LAMBDA = 10, over every sum of a run (fewer than 10^12 terms in all)
    all bounds hold with probability above 1 - 4e-10."""
    if n <= 0:
        return 0.0
    return min(gamma(n), math.expm1(LAMBDA * math.sqrt(n) * U + n * U * U / (1 - U)))


def _kind(model, node):
    """The rule that handles a traced node, or an error naming it."""
    if node.op in ("placeholder", "output"):
        return node.op
    if node.op == "call_module":
        mod = model.get_submodule(node.target)
        if isinstance(mod, nn.Conv2d) and mod.groups == 1 and mod.padding_mode == "zeros":
            return "conv"
        if isinstance(mod, nn.Linear):
            return "linear"
    if (node.op == "call_function" and node.target in (torch.relu, F.relu)) or (node.op == "call_method" and node.target == "relu"):
        return "relu"
    if node.op == "call_function" and node.target is F.max_pool2d:
        k = node.args[1] if len(node.args) > 1 else node.kwargs["kernel_size"]
        kw = node.kwargs
        if isinstance(k, int) and kw.get("stride") in (None, k) and kw.get("padding", 0) == 0 \
                and kw.get("dilation", 1) == 1 and not kw.get("ceil_mode") and not kw.get("return_indices"):
            return "maxpool"
    if (node.op == "call_function" and node.target in (torch.tanh, F.tanh)) or (node.op == "call_method" and node.target == "tanh"):
        return "tanh"
    if node.op == "call_function" and node.target is F.avg_pool2d:
        k = node.args[1] if len(node.args) > 1 else node.kwargs["kernel_size"]
        kw = node.kwargs
        if isinstance(k, int) and len(node.args) <= 2 and kw.get("stride") in (None, k) and kw.get("padding", 0) == 0 \
                and not kw.get("ceil_mode") and kw.get("divisor_override") is None:
            return "avgpool"
    if (node.op == "call_method" and node.target in ("flatten", "view", "reshape")) or \
            (node.op == "call_function" and node.target is torch.flatten):
        return "reshape"
    raise NotImplementedError(f"f32_error_bound: no float32 error rule for {node.format_node()}")


class Analysis:
    """The float32 error analysis of one model's training step."""

    def __init__(self, model, exact=True):
        """exact: carry the logits' gradient error and flipped masks to the
        parameters' gradients exactly too (_exactly), not only through
        magnitudes."""
        self.model, self.exact = model, exact
        self.nodes = list(torch.fx.symbolic_trace(model).graph.nodes)
        self.kinds = {n: _kind(model, n) for n in self.nodes}
        for n in self.nodes:
            if n.op != "output" and len(n.users) != 1:
                raise NotImplementedError(f"f32_error_bound: {n.name} has {len(n.users)} users (one is handled)")
        self.out = next(n for n in self.nodes if n.op == "output").args[0]

    def run(self, x, y):
        """The step's forward and backward in the model's dtype, by the
        traced graph (so exactly the model's ops): every node's value, with
        .grad its gradient; the parameters' .grad are set."""
        vals = {}
        for n in self.nodes:
            args = torch.fx.node.map_arg(n.args, lambda a: vals[a])
            kwargs = torch.fx.node.map_arg(n.kwargs, lambda a: vals[a])
            if n.op == "placeholder":
                v = x
            elif n.op == "call_module":
                v = self.model.get_submodule(n.target)(*args, **kwargs)
            elif n.op == "call_function":
                v = n.target(*args, **kwargs)
            elif n.op == "call_method":
                v = getattr(args[0], n.target)(*args[1:], **kwargs)
            else:
                continue
            if v.requires_grad:
                v.retain_grad()
            vals[n] = v
        F.cross_entropy(vals[self.out], y).backward(retain_graph=self.exact)
        return vals

    def forward_bound(self, x, y):
        """The loss info of a forward pass alone (no gradients): the float64
        loss and correct count and their bounds (tanh and avg_pool2d have
        forward rules only, no backward rules yet).

        First order, the logits' error is the sum over the nodes of each
        node's own rounding carried through the exact derivatives:
        |dz| <= sum_l |dz/dv_l| r_l, r_l the node's rule with exact inputs
        (E = 0 there). One backward pass per logit, through zero
        perturbations added to every node's output; unlike carrying E
        through magnitudes (|W| E, which assumes every error aligns with
        every weight's sign), this does not grow with each layer's
        absolute row sums. Needs every logit to depend on its own sample
        only (no batch norm in training mode)."""
        vals, perts, zero = {}, {}, {}
        for n in self.nodes:
            if n.op == "output":
                continue
            args = torch.fx.node.map_arg(n.args, lambda a: vals[a])
            kwargs = torch.fx.node.map_arg(n.kwargs, lambda a: vals[a])
            if n.op == "placeholder":
                v = x
            elif n.op == "call_module":
                v = self.model.get_submodule(n.target)(*args, **kwargs)
            elif n.op == "call_function":
                v = n.target(*args, **kwargs)
            else:
                v = getattr(args[0], n.target)(*args[1:], **kwargs)
            perts[n] = torch.zeros_like(v, requires_grad=True)
            vals[n] = v + perts[n]
        with torch.no_grad():
            own = {}
            for n in self.nodes:
                if n.op != "output":
                    zero = {a: torch.zeros_like(vals[a]) for a in n.all_input_nodes}
                    own[n] = getattr(self, "_fwd_" + self.kinds[n])(n, {k: v.detach() for k, v in vals.items()}, zero)[0]
        z = vals[self.out]
        Ez = torch.zeros_like(z)
        nodes = list(perts)
        for b in range(z.shape[0]):
            for c in range(z.shape[1]):
                grads = torch.autograd.grad(z[b, c], [perts[n] for n in nodes], retain_graph=True, allow_unused=True)
                Ez[b, c] = sum(float((g.abs() * own[n]).sum()) for n, g in zip(nodes, grads) if g is not None)
        return _cross_entropy(z.detach(), Ez, y)[1]

    def bound(self, vals, y):
        """Bounds on the float32 gradients' errors (by parameter name), and
        the loss info of the step (float64 loss and correct count, their
        bounds). The parameters are float32 numbers, the same in both."""
        E, ambiguous = {}, {}
        for n in self.nodes:  # forward: E bounds |activation32 - activation|
            if n.op != "output":
                E[n], ambiguous[n] = getattr(self, "_fwd_" + self.kinds[n])(n, vals, E)
        Dz, info = _cross_entropy(vals[self.out].detach(), E[self.out], y)
        flips = []
        G, D = self._backward(vals, E, ambiguous, Dz, None, flips)
        info["flips"] = sum(count for _, count in flips)
        info["unsettled"] = self._below([node for node, count in flips if count])
        if self.exact:
            # the logits' error and the flips' exactly, only each sum's own
            # rounding through magnitudes
            sites = []
            rest, own = self._backward(vals, E, ambiguous, torch.zeros_like(Dz), sites, [])
            exact = self._exactly(vals, Dz, sites, D, own)
            if exact is not None:
                G = {k: torch.minimum(G[k], rest[k] + exact[k]) for k in G}
        return G, info

    def _below(self, nodes):
        """The parameters of the layers at or below any of nodes (whose
        gradients a flip there reaches)."""
        last = max((self.nodes.index(n) for n in nodes), default=-1)
        return sorted(f"{n.target}.{name}" for n in self.nodes[:last + 1] if n.op == "call_module"
                      for name, _ in self.model.get_submodule(n.target).named_parameters())

    def _backward(self, vals, E, ambiguous, Dz, sites, flips):
        """The backward pass of the bounds: D bounds |grad32 - grad| of
        each node's output, from Dz at the logits. A flipped relu mask or
        pool route adds an error there, into D, or, when sites is given, as
        (node, out, make) into sites: make(D_out) is the error at node's
        gradient given the bound D_out on the flipping node out's. flips
        gets (node, how many of its elements may flip), node by node."""
        D, G = {self.out: Dz}, {}
        for n in reversed(self.nodes):
            if n.op not in ("output", "placeholder"):
                getattr(self, "_bwd_" + self.kinds[n])(n, vals, E, D, G, ambiguous, (sites, flips))
        return G, D

    def _exactly(self, vals, Dz, sites, D, own, budget=512):
        """The gradients are linear in the logits' gradient dz and in a
        flipped element's gradient, so an error there moves them by exactly
        sum_i |d grad / d g_i| bound_i (first order), without the
        magnitudes' overestimate of cancelling sums: one backward pass per
        element, from the logits (bound Dz) and then from each flip, top
        down. A flip's bound is make(D_out), D_out the error of dy where it
        flips: the smaller of D (all through magnitudes) and own (each
        sum's own rounding) plus what the logits and the flips above bring
        there exactly. None past the budget of backward passes."""
        plan = [(self.out, None, None)] + sites
        if int((Dz != 0).sum()) + sum(int((make(D[out]) != 0).sum()) for _, out, make in sites) > budget:
            return None
        params = dict(self.model.named_parameters())
        G = {k: torch.zeros_like(p) for k, p in params.items()}
        brought = {out: torch.zeros_like(vals[out]) for _, out, _ in sites}
        for k, (node, out, make) in enumerate(plan):
            w = Dz if out is None else torch.minimum(make(D[out]), make(own[out] + brought[out]))
            later = list(dict.fromkeys(o for _, o, _ in plan[k + 1:]))
            flat = w.flatten()
            for i in flat.nonzero().flatten().tolist():
                e = torch.zeros(vals[node].numel(), dtype=vals[node].dtype)
                e[i] = 1
                grads = torch.autograd.grad(vals[node], list(params.values()) + [vals[o] for o in later],
                                            e.reshape(vals[node].shape), retain_graph=True, allow_unused=True)
                for key, g in zip(list(params) + later, grads):
                    if g is not None:
                        (G if key in G else brought)[key] += g.abs() * flat[i]
        return G

    # --- forward rules: (bound on the node's output error, what backward needs)

    def _fwd_placeholder(self, n, vals, E):
        # cnnc: pixel * (1.0f/255.0f): the constant's rounding and the product's
        return gamma(2) * vals[n].abs(), None

    def _affine(self, n):
        mod = self.model.get_submodule(n.target)
        if isinstance(mod, nn.Linear):
            return mod, (lambda h, w: F.linear(h, w)), mod.in_features
        conv = lambda h, w: F.conv2d(h, w, None, mod.stride, mod.padding, mod.dilation)  # noqa: E731
        return mod, conv, mod.in_channels * mod.kernel_size[0] * mod.kernel_size[1]

    def _fwd_linear(self, n, vals, E):
        # y = W h + b, each output a sum of fan_in products and the bias:
        # |dy| <= |W| E_h + gamma_sum(fan_in + 1) (|W| |h| + |b|)
        mod, op, fan_in = self._affine(n)
        (h,) = n.args
        hv, W = vals[h].detach().abs(), mod.weight.detach().abs()
        out = op(E[h], W) + gamma_sum(fan_in + 1) * op(hv, W)
        if mod.bias is not None:
            out = out + gamma_sum(fan_in + 1) * mod.bias.detach().abs().reshape((1, -1) + (1,) * (hv.dim() - 2))
        return out, None

    _fwd_conv = _fwd_linear

    def _fwd_relu(self, n, vals, E):
        # relu is 1-Lipschitz; an input surely <= 0 gives exactly 0 in both
        (a,) = n.args
        av, Ea = vals[a].detach(), E[a]
        return torch.where(av + Ea <= 0, torch.zeros_like(Ea), Ea), None

    def _fwd_maxpool(self, n, vals, E):
        # |max(a32) - max(a)| <= max over the window of E; the float32 argmax
        # is one of the candidates j with a_j + E_j >= max_i (a_i - E_i)
        a, k = n.args[0], n.args[1] if len(n.args) > 1 else n.kwargs["kernel_size"]
        av, Ea = vals[a].detach(), E[a]
        B, C, H, W = av.shape
        win = F.unfold(av.reshape(B * C, 1, H, W), k, stride=k)
        ew = F.unfold(Ea.reshape(B * C, 1, H, W), k, stride=k)
        cand = win + ew >= (win - ew).max(1, keepdim=True).values
        out = ew.max(1).values.reshape(B, C, H // k, W // k)
        return out, (cand, k)

    def _fwd_tanh(self, n, vals, E):
        # tanh's slope 1 - tanh^2 is largest where the input interval
        # a +- E comes nearest 0: |tanh(a32) - tanh(a)| <= (1 -
        # tanh(max(|a| - E, 0))^2) E; tanhf adds its EXP_ULPS ulp (an ulp
        # at most 2u |y|)
        (a,) = n.args
        av, Ea = vals[a].detach(), E[a]
        slope = 1 - torch.tanh((av.abs() - Ea).clamp(min=0)) ** 2
        return slope * Ea + 2 * EXP_ULPS * U * vals[n].detach().abs(), None

    def _fwd_avgpool(self, n, vals, E):
        # cnnc sums the k*k window, then divides once: the mean of the
        # inputs' E, the sum's gamma_sum(k*k) of the mean of |a|, and the
        # division's u |y|
        a, k = n.args[0], n.args[1] if len(n.args) > 1 else n.kwargs["kernel_size"]
        av, Ea = vals[a].detach(), E[a]
        out = F.avg_pool2d(Ea, k) + gamma_sum(k * k) * F.avg_pool2d(av.abs(), k) + U * vals[n].detach().abs()
        return out, None

    def _fwd_reshape(self, n, vals, E):
        src = n.args[0]
        shape = vals[n].shape
        return E[src].reshape(shape), None

    # --- backward rules: D of the node's inputs, G of its parameters

    def _bwd_linear(self, n, vals, E, D, G, ambiguous, sites):
        # dh = W^T dy (fan_out terms), dW = dy h^T (summed over the batch),
        # db = sum of dy:  |d dh| <= |W|^T D_y + gamma_sum(fan_out) |W|^T |dy|,
        # |d dW| <= D_y |h|^T + |dy| E_h^T + gamma_sum(B) |dy| |h|^T,
        # |d db| <= sum D_y + gamma_sum(B) sum |dy|
        mod = self.model.get_submodule(n.target)
        (h,) = n.args
        hv, dy, Dy = vals[h].detach(), vals[n].grad, D[n]
        W = mod.weight.detach().abs()
        ady, ah = dy.abs(), hv.abs()
        B = hv.shape[0]
        if h.op != "placeholder":
            D[h] = Dy @ W + gamma_sum(mod.out_features) * (ady @ W)
        G[n.target + ".weight"] = Dy.t() @ ah + ady.t() @ E[h] + gamma_sum(B) * (ady.t() @ ah)
        if mod.bias is not None:
            G[n.target + ".bias"] = Dy.sum(0) + gamma_sum(B) * ady.sum(0)

    def _bwd_conv(self, n, vals, E, D, G, ambiguous, sites):
        # the same as linear, with the sums of a convolution: dh sums
        # out_channels*kh*kw terms, dW and db sum batch*H_out*W_out
        mod = self.model.get_submodule(n.target)
        (h,) = n.args
        hv, dy, Dy = vals[h].detach(), vals[n].grad, D[n]
        W = mod.weight.detach().abs()
        ady, ah = dy.abs(), hv.abs()
        geo = dict(stride=mod.stride, padding=mod.padding, dilation=mod.dilation)
        kh, kw = mod.kernel_size
        terms = dy.shape[0] * dy.shape[2] * dy.shape[3]
        if h.op != "placeholder":
            D[h] = (conv2d_input(hv.shape, W, Dy, **geo)
                    + gamma_sum(mod.out_channels * kh * kw) * conv2d_input(hv.shape, W, ady, **geo))
        G[n.target + ".weight"] = (conv2d_weight(ah, W.shape, Dy, **geo) + conv2d_weight(E[h], W.shape, ady, **geo)
                                   + gamma_sum(terms) * conv2d_weight(ah, W.shape, ady, **geo))
        if mod.bias is not None:
            G[n.target + ".bias"] = Dy.sum((0, 2, 3)) + gamma_sum(terms) * ady.sum((0, 2, 3))

    def _bwd_relu(self, n, vals, E, D, G, ambiguous, sites):
        # the mask is certain where |a| > E_a (a = 0 passes nothing in
        # either); elsewhere float32 may pass dy where the truth does not, or
        # the other way round: an error of up to |dy| + D_y
        (a,) = n.args
        av, Ea, dy, Dy = vals[a].detach(), E[a], vals[n].grad, D[n]
        certain = (av - Ea > 0) | (av + Ea <= 0)
        D[a] = torch.where(av - Ea > 0, Dy, torch.zeros_like(Dy))
        _flips(D, sites, a, n, lambda Dout: torch.where(certain, torch.zeros_like(Dout), dy.abs() + Dout))

    def _bwd_maxpool(self, n, vals, E, D, G, ambiguous, sites):
        # a window with one candidate routes dy where the truth does (error
        # D_y); with several, each candidate may get dy or not: |dy| + D_y
        # (none below a relu that is surely off: no gradient passes there in
        # either)
        a = n.args[0]
        cand, k = ambiguous[n]
        B, C, H, W = vals[a].shape
        dy, Dy = vals[n].grad.reshape(B * C, 1, -1), D[n].reshape(B * C, 1, -1)
        several = cand.sum(1, keepdim=True) > 1
        fold = lambda t: F.fold(t, (H, W), k, stride=k).reshape(B, C, H, W)  # noqa: E731
        D[a] = fold(cand * torch.where(several, torch.zeros_like(Dy), Dy))
        live = 1
        if self.kinds[a] == "relu":
            pre = a.args[0]
            live = vals[pre].detach() + E[pre] > 0
        _flips(D, sites, a, n, lambda Dout: live * fold(cand * several * (dy.abs() + Dout.reshape(B * C, 1, -1))))

    def _bwd_tanh(self, n, vals, E, D, G, ambiguous, sites):
        # cnnc: dx = dy * (1 - v*v), v = tanh's float32 output, within E_y
        # of y: |(1 - v^2) - (1 - y^2)| <= 2|y| E_y + E_y^2; v*v, 1 - vv and
        # the product round once each:
        # |d dx| <= (1 - y^2) D_y + |dy| (2|y| E_y + E_y^2 + u y^2 + 2u (1 - y^2))
        (a,) = n.args
        y, Ey, dy, Dy = vals[n].detach(), E[n], vals[n].grad, D[n]
        slope = 1 - y * y
        D[a] = slope * Dy + dy.abs() * (2 * y.abs() * Ey + Ey * Ey + U * y * y + 2 * U * slope)

    def _bwd_avgpool(self, n, vals, E, D, G, ambiguous, sites):
        # stride = kernel: each input's gradient is its window's dy divided
        # by k*k, one rounding: |d dx| <= D_y/(k k) + u |dy|/(k k)
        a, k = n.args[0], n.args[1] if len(n.args) > 1 else n.kwargs["kernel_size"]
        up = lambda t: t.repeat_interleave(k, 2).repeat_interleave(k, 3) / (k * k)  # noqa: E731
        D[a] = up(D[n]) + U * up(vals[n].grad.abs())

    def _bwd_reshape(self, n, vals, E, D, G, ambiguous, sites):
        src = n.args[0]
        D[src] = D[n].reshape(vals[src].shape)


def _flips(D, sites, node, out, make):
    """A flip's error at node's gradient, make(D[out]): into D, or a site."""
    sites, flips = sites
    bound = make(D[out])
    flips.append((node, int((bound != 0).sum())))
    if sites is None:
        D[node] = D[node] + bound
    else:
        sites.append((node, out, make))


def _cross_entropy(z, Ez, y):
    """The bound on cnnc's dlogits = expf(z - lse) / B - onehot / B (lse =
    max + logf(sum expf(z - max))), and the loss info.

    lse is 1-Lipschitz in the max norm; computing it adds the sum's relative
    error r = gamma_sum(C-1) + 2u (expf) + u |z - max| (the argument's rounding),
    logf's 2 ulp and the final add:
      d_lse <= max_c E_z + r/(1-r) + 2u |lse - max| + u |lse|.
    exp turns an absolute error d of its argument into a relative one:
      |d dz_c| <= p_c/B (E_z,c + d_lse + u |z_c - lse| + 4u)   (expf 2u, 1/B and the product)
    and at the label the subtraction of 1/B adds u/B + u |dz_c|.
    The loss, mean over B rows of lse - z_label: each row within
    d_lse + E_z,label + u |L_b|, the sum and the scaling (gamma_sum(B) + 2u) mean |L_b|.
    A sample's prediction may flip when another logit's interval reaches
    the top one's."""
    B, C = z.shape
    lse, best = torch.logsumexp(z, 1), z.max(1).values
    p = torch.softmax(z, 1)
    r = gamma_sum(C - 1) + EXP_ULPS * U + U * (best[:, None] - z).max(1).values
    dlse = Ez.max(1).values + r / (1 - r) + 2 * U * (lse - best).abs() + U * lse.abs()
    Dz = p / B * (Ez + dlse[:, None] + U * (z - lse[:, None]).abs() + (EXP_ULPS + 2) * U)
    rows = torch.arange(B)
    Dz[rows, y] += U / B + U * (p[rows, y] - 1).abs() / B
    Lb = lse - z[rows, y]
    loss_bound = (dlse + Ez[rows, y] + U * Lb.abs()).mean() + (gamma_sum(B) + 2 * U) * Lb.abs().mean()
    top = z.argmax(1)
    reach = z + Ez >= (z[rows, top] - Ez[rows, top])[:, None]
    reach[rows, top] = False
    return Dz, {"loss": float(Lb.mean()), "loss_bound": float(loss_bound),
                "correct": int((top == y).sum()), "may_flip": int(reach.any(1).sum())}


def optimizer_step(opt, model, G):
    """opt.step() on float32 parameters and state, with bounds on how far a
    float32 step (templates/update.cu.tmpl) may land from it, given G, the
    bounds on the gradients' errors: by parameter name, and by
    "optimizer.<param>.<state>" for the state."""
    (group,) = opt.param_groups
    kind = {torch.optim.SGD: "sgd", torch.optim.Adam: "adam", torch.optim.AdamW: "adamw"}[type(opt)]
    if group.get("maximize") or group.get("amsgrad") or group.get("dampening", 0) != 0:
        raise NotImplementedError(f"f32_error_bound: {type(opt).__name__} options {group}")
    named = list(model.named_parameters())
    before = {name: (p.detach().clone(), p.grad.detach().clone(),
                     {k: v.clone() for k, v in opt.state[p].items()}) for name, p in named}
    opt.step()
    bounds = {}
    for name, p in named:
        p0, g, st0 = before[name]
        rule = _sgd if kind == "sgd" else _adam
        bounds[name], state = rule(kind, group, name, p0, g, st0, opt.state[p], p.detach(), G[name])
        bounds.update({f"optimizer.{name}.{k}": v for k, v in state.items()})
    return bounds


def _sgd(kind, gr, name, p0, g, st0, st, p1, Dg):
    # g' = g + wd p; buf = g' (first step) or mom buf + g'; d = g' + mom buf
    # (Nesterov) or buf; p -= lr d. Each product with a float32 constant
    # rounds twice (the constant, the product), each add once.
    lr, mom, wd = gr["lr"], gr["momentum"], gr["weight_decay"]
    gp = g
    if wd:
        gp = g + wd * p0
        Dg = Dg + U * (2 * (wd * p0).abs() + gp.abs())
    d, Dd, state = gp, Dg, {}
    if mom:
        buf = st["momentum_buffer"]
        Db = Dg
        if st0.get("momentum_buffer") is not None:
            Db = Dg + U * (2 * (mom * st0["momentum_buffer"]).abs() + buf.abs())
        d, Dd, state["momentum_buffer"] = buf, Db, Db
        if gr["nesterov"]:
            d = gp + mom * buf
            Dd = Dg + mom * Db + U * (2 * (mom * buf).abs() + d.abs())
    _check_step(name, p0 - lr * d, p1)
    return lr * Dd + U * (2 * (lr * d).abs() + p1.abs()), state


def _adam(kind, gr, name, p0, g, st0, st, p1, Dg):
    # AdamW: p *= 1 - lr wd. Adam: g' = g + wd p. m = b1 m + (1-b1) g',
    # v = b2 v + (1-b2) g' g', and p -= F(m, v) = lr/bc1 m / (sqrt(v)/sqrt(bc2) + eps).
    # F increases with m and decreases with v, so over the box m +- Dm,
    # v +- Dv its extremes are at two corners: the update's sensitivity,
    # exact even where v is tiny and eps dominates. And Cauchy-Schwarz caps
    # every Adam update: |m^| <= C_t sqrt(v^), C_t^2 = sum_i a_i^2 / b_i
    # over the weights a_i of m^ and b_i of v^, so |F32| <= lr C_t: a
    # gradient known only to within its own size moves the parameter by at
    # most lr C_t + |F| from the truth.
    lr, (b1, b2), eps, wd = gr["lr"], gr["betas"], gr["eps"], gr["weight_decay"]
    t = int(st["step"])
    gp, pd, Dp = g, p0, 0
    if kind == "adamw" and wd:
        pd = p0 * (1 - lr * wd)
        Dp = U * (2 + 3 * lr * wd / (1 - lr * wd)) * pd.abs()
    elif wd:
        gp = g + wd * p0
        Dg = Dg + U * (2 * (wd * p0).abs() + gp.abs())
    m0 = st0.get("exp_avg", torch.zeros_like(p0))
    v0 = st0.get("exp_avg_sq", torch.zeros_like(p0))
    m, v = st["exp_avg"], st["exp_avg_sq"]
    Dm = (1 - b1) * Dg + U * (2 * (b1 * m0).abs() + 2 * ((1 - b1) * gp).abs() + m.abs())
    Dv = (1 - b2) * (2 * gp.abs() * Dg + Dg * Dg) + U * (2 * (b2 * v0).abs() + 3 * ((1 - b2) * gp * gp).abs() + v.abs())
    bc1, sbc2 = 1 - b1 ** t, math.sqrt(1 - b2 ** t)

    def update(mm, vv):
        return lr / bc1 * mm / (vv.sqrt() / sbc2 + eps)

    F0 = update(m, v)
    mhi, mlo = m + Dm, m - Dm
    vhi, vlo = v + Dv, (v - Dv).clamp(min=0)
    dF = torch.maximum(update(mhi, torch.where(mhi >= 0, vlo, vhi)) - F0, F0 - update(mlo, torch.where(mlo >= 0, vhi, vlo)))
    a = [(1 - b1) * b1 ** (t - i) / bc1 for i in range(1, t + 1)]
    b = [(1 - b2) * b2 ** (t - i) / (1 - b2 ** t) for i in range(1, t + 1)]
    cap = lr * math.sqrt(sum(x * x / y for x, y in zip(a, b))) * (1 + gamma(5 * t + 10))
    # the update's own ten roundings: lr/bc1, *m, sqrtf, /sqrt(bc2), +eps, / and the constants
    dF = torch.minimum(dF + gamma(10) * (F0.abs() + dF), F0.abs() + cap)
    _check_step(name, pd - F0, p1)
    return Dp + dF + U * p1.abs(), {"exp_avg": Dm, "exp_avg_sq": Dv}


def _check_step(name, mine, torchs):
    """The analysis follows torch.optim's formulas: its step must be torch's."""
    err = (mine - torchs).abs().max().item()
    scale = max(torchs.abs().max().item(), 1e-300)
    if err > 1e-12 * scale:
        raise AssertionError(f"f32_error_bound: {name}: the analysed step differs from torch.optim's by {err:.2e}")
