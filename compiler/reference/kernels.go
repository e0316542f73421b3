package reference

import (
	"math"

	"github.com/cnnc/cnnc/compiler/ir"
)

// env is what a kernel may read besides its inputs.
type env struct {
	e        *Executor
	r        *Result
	batch    int
	training bool // dropout on
	update   bool // apply optimizer updates (fused ones included)
	// A memory plan may run part of the step on micro-batches: the call
	// then covers samples [firstSample, firstSample+batch) of a batch of
	// fullBatch (0: the call's own batch).
	firstSample int
	fullBatch   int
}

// lossBatch is the batch the loss averages over: the whole batch, also
// when a call sees one micro-batch of it, so that the micro-batches'
// gradients add up to the full batch's.
func (env *env) lossBatch() float64 {
	if env.fullBatch > 0 {
		return float64(env.fullBatch)
	}
	return float64(env.batch)
}

// kernel computes a node's outputs from its inputs (update kernels write
// the parameter and state inputs in place and return nothing).
type kernel func(env *env, n *ir.Node, ins [][]float64) [][]float64

var kernels map[ir.Op]kernel

func init() {
	kernels = map[ir.Op]kernel{
		ir.OpConv2D:           conv2d,
		ir.OpReLU:             relu,
		ir.OpMaxPool2D:        maxpool2d,
		ir.OpAvgPool2D:        avgpool2d,
		ir.OpFlatten:          copyKernel,
		ir.OpLinear:           linear,
		ir.OpDropout:          dropout,
		ir.OpAdd:              add,
		ir.OpCrossEntropy:     crossEntropy,
		ir.OpConv2DGradInput:  conv2dGradInput,
		ir.OpConv2DGradWeight: conv2dGradWeight,
		ir.OpConv2DGradBias:   conv2dGradBias,
		ir.OpReLUGrad:         reluGrad,
		ir.OpMaxPool2DGrad:    maxpool2dGrad,
		ir.OpAvgPool2DGrad:    avgpool2dGrad,
		ir.OpReshape:          copyKernel,
		ir.OpLinearGradInput:  linearGradInput,
		ir.OpLinearGradWeight: linearGradWeight,
		ir.OpLinearGradBias:   linearGradBias,
		ir.OpDropoutGrad:      dropout,
		ir.OpCrossEntropyGrad: crossEntropyGrad,
		ir.OpSGDUpdate:        sgdUpdate,
		ir.OpAdamUpdate:       adamUpdate,
	}
	registerFusedKernels()
}

func outLen(env *env, v *ir.Value) int { return int(v.Type.Elems(int64(env.batch))) }

// geometry of a conv or pool: input C×H×W, output O×HO×WO, window.
type geom struct {
	c, h, w, o, ho, wo int
	kh, kw, sh, sw     int
	ph, pw             int
}

func windowGeom(a ir.Attrs, x, y ir.Type) geom {
	return geom{
		c: int(x.Dims[0]), h: int(x.Dims[1]), w: int(x.Dims[2]),
		o: int(y.Dims[0]), ho: int(y.Dims[1]), wo: int(y.Dims[2]),
		kh: int(a.Kernel[0]), kw: int(a.Kernel[1]),
		sh: int(a.Stride[0]), sw: int(a.Stride[1]),
		ph: int(a.Pad[0]), pw: int(a.Pad[1]),
	}
}

func conv2d(env *env, n *ir.Node, ins [][]float64) [][]float64 {
	g := windowGeom(n.Attrs, n.Ins[0].Type, n.Out().Type)
	x, w := ins[0], ins[1]
	y := make([]float64, outLen(env, n.Out()))
	for b := 0; b < env.batch; b++ {
		for o := 0; o < g.o; o++ {
			for oy := 0; oy < g.ho; oy++ {
				for ox := 0; ox < g.wo; ox++ {
					s := 0.0
					if len(ins) > 2 {
						s = ins[2][o]
					}
					for c := 0; c < g.c; c++ {
						for ky := 0; ky < g.kh; ky++ {
							iy := oy*g.sh - g.ph + ky
							if iy < 0 || iy >= g.h {
								continue
							}
							for kx := 0; kx < g.kw; kx++ {
								ix := ox*g.sw - g.pw + kx
								if ix < 0 || ix >= g.w {
									continue
								}
								s += x[((b*g.c+c)*g.h+iy)*g.w+ix] * w[((o*g.c+c)*g.kh+ky)*g.kw+kx]
							}
						}
					}
					y[((b*g.o+o)*g.ho+oy)*g.wo+ox] = s
				}
			}
		}
	}
	return [][]float64{y}
}

func conv2dGradInput(env *env, n *ir.Node, ins [][]float64) [][]float64 {
	g := windowGeom(n.Attrs, n.Out().Type, n.Ins[0].Type)
	dy, w := ins[0], ins[1]
	dx := make([]float64, outLen(env, n.Out()))
	for b := 0; b < env.batch; b++ {
		for o := 0; o < g.o; o++ {
			for oy := 0; oy < g.ho; oy++ {
				for ox := 0; ox < g.wo; ox++ {
					d := dy[((b*g.o+o)*g.ho+oy)*g.wo+ox]
					for c := 0; c < g.c; c++ {
						for ky := 0; ky < g.kh; ky++ {
							iy := oy*g.sh - g.ph + ky
							if iy < 0 || iy >= g.h {
								continue
							}
							for kx := 0; kx < g.kw; kx++ {
								ix := ox*g.sw - g.pw + kx
								if ix < 0 || ix >= g.w {
									continue
								}
								dx[((b*g.c+c)*g.h+iy)*g.w+ix] += d * w[((o*g.c+c)*g.kh+ky)*g.kw+kx]
							}
						}
					}
				}
			}
		}
	}
	return [][]float64{dx}
}

func conv2dGradWeight(env *env, n *ir.Node, ins [][]float64) [][]float64 {
	g := windowGeom(n.Attrs, n.Ins[1].Type, n.Ins[0].Type)
	dy, x := ins[0], ins[1]
	dw := make([]float64, n.Out().Type.SampleElems())
	for b := 0; b < env.batch; b++ {
		for o := 0; o < g.o; o++ {
			for oy := 0; oy < g.ho; oy++ {
				for ox := 0; ox < g.wo; ox++ {
					d := dy[((b*g.o+o)*g.ho+oy)*g.wo+ox]
					for c := 0; c < g.c; c++ {
						for ky := 0; ky < g.kh; ky++ {
							iy := oy*g.sh - g.ph + ky
							if iy < 0 || iy >= g.h {
								continue
							}
							for kx := 0; kx < g.kw; kx++ {
								ix := ox*g.sw - g.pw + kx
								if ix < 0 || ix >= g.w {
									continue
								}
								dw[((o*g.c+c)*g.kh+ky)*g.kw+kx] += d * x[((b*g.c+c)*g.h+iy)*g.w+ix]
							}
						}
					}
				}
			}
		}
	}
	return [][]float64{dw}
}

func conv2dGradBias(env *env, n *ir.Node, ins [][]float64) [][]float64 {
	t := n.Ins[0].Type
	o, hw := int(t.Dims[0]), int(t.Dims[1]*t.Dims[2])
	db := make([]float64, o)
	for b := 0; b < env.batch; b++ {
		for c := 0; c < o; c++ {
			for i := 0; i < hw; i++ {
				db[c] += ins[0][(b*o+c)*hw+i]
			}
		}
	}
	return [][]float64{db}
}

func relu(env *env, n *ir.Node, ins [][]float64) [][]float64 {
	y := make([]float64, len(ins[0]))
	for i, v := range ins[0] {
		y[i] = math.Max(v, 0)
	}
	return [][]float64{y}
}

func reluGrad(env *env, n *ir.Node, ins [][]float64) [][]float64 {
	dx := make([]float64, len(ins[0]))
	for i, d := range ins[0] {
		if ins[1][i] > 0 {
			dx[i] = d
		}
	}
	return [][]float64{dx}
}

// maxWindow returns the flat input index of the maximum of one pooling
// window (the first one in scan order on ties, as PyTorch), or -1.
func maxWindow(x []float64, g geom, b, c, oy, ox int) int {
	best := -1
	for ky := 0; ky < g.kh; ky++ {
		iy := oy*g.sh - g.ph + ky
		if iy < 0 || iy >= g.h {
			continue
		}
		for kx := 0; kx < g.kw; kx++ {
			ix := ox*g.sw - g.pw + kx
			if ix < 0 || ix >= g.w {
				continue
			}
			i := ((b*g.c+c)*g.h+iy)*g.w + ix
			if best < 0 || x[i] > x[best] {
				best = i
			}
		}
	}
	return best
}

func poolGeom(n *ir.Node, x, y ir.Type) geom {
	g := windowGeom(n.Attrs, x, y)
	g.o = g.c
	return g
}

func maxpool2d(env *env, n *ir.Node, ins [][]float64) [][]float64 {
	g := poolGeom(n, n.Ins[0].Type, n.Out().Type)
	y := make([]float64, outLen(env, n.Out()))
	for b := 0; b < env.batch; b++ {
		for c := 0; c < g.c; c++ {
			for oy := 0; oy < g.ho; oy++ {
				for ox := 0; ox < g.wo; ox++ {
					y[((b*g.c+c)*g.ho+oy)*g.wo+ox] = ins[0][maxWindow(ins[0], g, b, c, oy, ox)]
				}
			}
		}
	}
	return [][]float64{y}
}

func maxpool2dGrad(env *env, n *ir.Node, ins [][]float64) [][]float64 {
	dy, x := ins[0], ins[1]
	g := poolGeom(n, n.Ins[1].Type, n.Ins[0].Type)
	dx := make([]float64, len(x))
	for b := 0; b < env.batch; b++ {
		for c := 0; c < g.c; c++ {
			for oy := 0; oy < g.ho; oy++ {
				for ox := 0; ox < g.wo; ox++ {
					dx[maxWindow(x, g, b, c, oy, ox)] += dy[((b*g.c+c)*g.ho+oy)*g.wo+ox]
				}
			}
		}
	}
	return [][]float64{dx}
}

// avgWindow visits the in-bounds inputs of a window; padding counts in the
// divisor (count_include_pad=True, PyTorch's default).
func avgWindow(g geom, b, c, oy, ox int, visit func(i int)) {
	for ky := 0; ky < g.kh; ky++ {
		iy := oy*g.sh - g.ph + ky
		if iy < 0 || iy >= g.h {
			continue
		}
		for kx := 0; kx < g.kw; kx++ {
			ix := ox*g.sw - g.pw + kx
			if ix >= 0 && ix < g.w {
				visit(((b*g.c+c)*g.h+iy)*g.w + ix)
			}
		}
	}
}

func avgpool2d(env *env, n *ir.Node, ins [][]float64) [][]float64 {
	g := poolGeom(n, n.Ins[0].Type, n.Out().Type)
	y := make([]float64, outLen(env, n.Out()))
	div := float64(g.kh * g.kw)
	for b := 0; b < env.batch; b++ {
		for c := 0; c < g.c; c++ {
			for oy := 0; oy < g.ho; oy++ {
				for ox := 0; ox < g.wo; ox++ {
					s := 0.0
					avgWindow(g, b, c, oy, ox, func(i int) { s += ins[0][i] })
					y[((b*g.c+c)*g.ho+oy)*g.wo+ox] = s / div
				}
			}
		}
	}
	return [][]float64{y}
}

func avgpool2dGrad(env *env, n *ir.Node, ins [][]float64) [][]float64 {
	g := poolGeom(n, n.Out().Type, n.Ins[0].Type)
	dx := make([]float64, outLen(env, n.Out()))
	div := float64(g.kh * g.kw)
	for b := 0; b < env.batch; b++ {
		for c := 0; c < g.c; c++ {
			for oy := 0; oy < g.ho; oy++ {
				for ox := 0; ox < g.wo; ox++ {
					d := ins[0][((b*g.c+c)*g.ho+oy)*g.wo+ox] / div
					avgWindow(g, b, c, oy, ox, func(i int) { dx[i] += d })
				}
			}
		}
	}
	return [][]float64{dx}
}

func copyKernel(env *env, n *ir.Node, ins [][]float64) [][]float64 {
	return [][]float64{append([]float64(nil), ins[0]...)}
}

func linear(env *env, n *ir.Node, ins [][]float64) [][]float64 {
	x, w := ins[0], ins[1]
	out, in := int(n.Attrs.Out), int(n.Ins[1].Type.Dims[1])
	y := make([]float64, env.batch*out)
	for b := 0; b < env.batch; b++ {
		for o := 0; o < out; o++ {
			s := 0.0
			if len(ins) > 2 {
				s = ins[2][o]
			}
			for i := 0; i < in; i++ {
				s += x[b*in+i] * w[o*in+i]
			}
			y[b*out+o] = s
		}
	}
	return [][]float64{y}
}

func linearGradInput(env *env, n *ir.Node, ins [][]float64) [][]float64 {
	dy, w := ins[0], ins[1]
	out, in := int(n.Ins[1].Type.Dims[0]), int(n.Ins[1].Type.Dims[1])
	dx := make([]float64, env.batch*in)
	for b := 0; b < env.batch; b++ {
		for o := 0; o < out; o++ {
			d := dy[b*out+o]
			for i := 0; i < in; i++ {
				dx[b*in+i] += d * w[o*in+i]
			}
		}
	}
	return [][]float64{dx}
}

func linearGradWeight(env *env, n *ir.Node, ins [][]float64) [][]float64 {
	dy, x := ins[0], ins[1]
	out, in := int(n.Out().Type.Dims[0]), int(n.Out().Type.Dims[1])
	dw := make([]float64, out*in)
	for b := 0; b < env.batch; b++ {
		for o := 0; o < out; o++ {
			d := dy[b*out+o]
			for i := 0; i < in; i++ {
				dw[o*in+i] += d * x[b*in+i]
			}
		}
	}
	return [][]float64{dw}
}

func linearGradBias(env *env, n *ir.Node, ins [][]float64) [][]float64 {
	out := int(n.Out().Type.Dims[0])
	db := make([]float64, out)
	for b := 0; b < env.batch; b++ {
		for o := 0; o < out; o++ {
			db[o] += ins[0][b*out+o]
		}
	}
	return [][]float64{db}
}

// dropout serves forward and gradient alike: both multiply by the same
// regenerated mask, scaled by 1/(1-p). Off when not training.
func dropout(env *env, n *ir.Node, ins [][]float64) [][]float64 {
	y := append([]float64(nil), ins[0]...)
	if !env.training {
		return [][]float64{y}
	}
	p := n.Attrs.P
	scale := 1 / (1 - p)
	// masks are keyed by the element's index in the whole batch, so a
	// micro-batch draws the same mask as the full batch did
	first := int64(env.firstSample) * n.Ins[0].Type.SampleElems()
	for i := range y {
		if DropoutKeep(env.e.Seed, n.Attrs.Stream, env.e.Step, first+int64(i), p) {
			y[i] *= scale
		} else {
			y[i] = 0
		}
	}
	return [][]float64{y}
}

func add(env *env, n *ir.Node, ins [][]float64) [][]float64 {
	y := make([]float64, len(ins[0]))
	for i := range y {
		y[i] = ins[0][i] + ins[1][i]
	}
	return [][]float64{y}
}

// logSoftmaxRow returns the row's log-sum-exp, computed stably.
func logSumExp(row []float64) float64 {
	m := math.Inf(-1)
	for _, v := range row {
		m = math.Max(m, v)
	}
	s := 0.0
	for _, v := range row {
		s += math.Exp(v - m)
	}
	return m + math.Log(s)
}

// crossEntropy is PyTorch's F.cross_entropy with label_smoothing ε: the
// target distribution is q = (1-ε)·onehot(label) + ε/C, so a row's loss is
// -Σ_c q_c·log softmax_c = lse - (1-ε)·x_label - ε·mean(x) (ε = 0: the
// plain lse - x_label).
func crossEntropy(env *env, n *ir.Node, ins [][]float64) [][]float64 {
	logits, labels := ins[0], ins[1]
	c := int(n.Ins[0].Type.Dims[0])
	eps := n.Attrs.Smoothing
	loss := 0.0
	for b := 0; b < env.batch; b++ {
		row := logits[b*c : (b+1)*c]
		l := logSumExp(row) - (1-eps)*row[int(labels[b])]
		if eps != 0 {
			sum := 0.0
			for _, v := range row {
				sum += v
			}
			l -= eps * sum / float64(c)
		}
		loss += l
	}
	return [][]float64{{loss / env.lossBatch()}}
}

// crossEntropyGrad is the loss's gradient: (softmax - q) / batch.
func crossEntropyGrad(env *env, n *ir.Node, ins [][]float64) [][]float64 {
	logits, labels := ins[0], ins[1]
	c := int(n.Ins[0].Type.Dims[0])
	eps := n.Attrs.Smoothing
	d := make([]float64, len(logits))
	inv := 1 / env.lossBatch()
	for b := 0; b < env.batch; b++ {
		row := logits[b*c : (b+1)*c]
		lse := logSumExp(row)
		for j := range row {
			d[b*c+j] = (math.Exp(row[j]-lse) - eps/float64(c)) * inv
		}
		d[b*c+int(labels[b])] -= (1 - eps) * inv
	}
	return [][]float64{d}
}

// sgdUpdate is torch.optim.SGD (dampening 0): g += wd·p; buf = m·buf + g
// (buf = g on the first step); g = g + m·buf if nesterov else buf; p -= lr·g.
func sgdUpdate(env *env, n *ir.Node, ins [][]float64) [][]float64 {
	o := n.Attrs.Opt
	p, grad := ins[0], ins[1]
	for i := range p {
		g := grad[i] + o.WeightDecay*p[i]
		if o.Momentum != 0 {
			buf := ins[2]
			if env.e.Step == 0 {
				buf[i] = g
			} else {
				buf[i] = o.Momentum*buf[i] + g
			}
			if o.Nesterov {
				g += o.Momentum * buf[i]
			} else {
				g = buf[i]
			}
		}
		p[i] -= o.LR * g
	}
	return nil
}

// adamUpdate is torch.optim.Adam (L2 weight decay added to the gradient)
// and AdamW (decoupled decay p *= 1 - lr·wd), without amsgrad.
func adamUpdate(env *env, n *ir.Node, ins [][]float64) [][]float64 {
	o := n.Attrs.Opt
	p, grad, m, v := ins[0], ins[1], ins[2], ins[3]
	t := float64(env.e.Step + 1)
	bc1 := 1 - math.Pow(o.Beta1, t)
	bc2 := 1 - math.Pow(o.Beta2, t)
	for i := range p {
		g := grad[i]
		if o.Kind == ir.AdamW {
			p[i] *= 1 - o.LR*o.WeightDecay
		} else {
			g += o.WeightDecay * p[i]
		}
		m[i] = o.Beta1*m[i] + (1-o.Beta1)*g
		v[i] = o.Beta2*v[i] + (1-o.Beta2)*g*g
		denom := math.Sqrt(v[i])/math.Sqrt(bc2) + o.Eps
		p[i] -= o.LR / bc1 * m[i] / denom
	}
	return nil
}
