package main

import (
	"errors"
	"io"
	"strings"

	"github.com/cnnc/cnnc/codegen"
	"github.com/cnnc/cnnc/codegen/cpu"
	"github.com/cnnc/cnnc/compiler"
	"github.com/cnnc/cnnc/compiler/ir"
	"github.com/cnnc/cnnc/compiler/plan"
	"github.com/cnnc/cnnc/dsl"
)

// backendError reports an error of the steps after the compiler — the
// memory plan and code generation (driver.Compile) — at the model's
// line: a budget no plan meets at memory_budget (or naming the flag), a
// layer whose kernels cannot be generated at that layer. Anything else
// (which would be cnnc's own fault) still names the model's position.
func backendError(path string, res *compiler.Result, err error, stderr io.Writer) error {
	var be *plan.BudgetError
	if errors.As(err, &be) {
		return planError(path, err, stderr)
	}
	d := layerError(res)
	if d == nil {
		d = dsl.Errorf(res.File.Model.Pos, "model %s: cnnc cannot compile it (an internal error; please report it): %v", res.Graph.Name, err).Span(len("model"))
	}
	src, _ := dsl.ReadFile(path)
	d.Span(identLen(src, d.Pos.Offset))
	printDiagnostics(stderr, dsl.Diagnostics{d}, map[string][]byte{path: src})
	return exitError{exitModel}
}

// layerError finds the first layer whose kernels codegen refuses, by
// generating each node of the fused graph alone at the batch.
func layerError(res *compiler.Result) *dsl.Diagnostic {
	for _, n := range res.Graph.Nodes {
		_, err := codegen.GenerateNodes(res.Graph.Name, []*ir.Node{n}, codegen.Options{Batch: res.Train.Batch})
		var nr *codegen.NoRuleError
		if err == nil || errors.As(err, &nr) {
			continue
		}
		msg := strings.TrimPrefix(err.Error(), "codegen: ")
		msg = strings.TrimPrefix(msg, n.Text()+": ")
		return dsl.Errorf(n.Pos, "%s: cnnc's kernels cannot run this layer: %s", n.Name, msg).
			Hint("a limit of the kernels cnnc generates: a smaller window, stride or channel count avoids it")
	}
	return nil
}

// identLen is the length of the name at offset (the op of a call), to
// underline it.
func identLen(src []byte, offset int) int {
	n := 0
	for offset+n < len(src) {
		c := src[offset+n]
		if c != '_' && (c < '0' || c > '9') && (c|0x20 < 'a' || c|0x20 > 'z') {
			break
		}
		n++
	}
	return max(n, 1)
}

// cpuRefusal finds the first layer of res whose kernels the CPU target
// (codegen/cpu) cannot generate — an op it has no kernels for yet, or a
// form of one (an optimizer it has no update for) — as a diagnostic of the
// given severity at that layer; nil when it generates every node.
func cpuRefusal(res *compiler.Result, warn bool) *dsl.Diagnostic {
	for _, n := range res.Graph.Nodes {
		_, err := cpu.GenerateNodes(res.Graph.Name, []*ir.Node{n}, codegen.Options{Batch: res.Train.Batch})
		var nr *codegen.NoRuleError
		if !errors.As(err, &nr) || nr.Target == "" {
			continue
		}
		what := nr.Op.String()
		if nr.Reason != "" {
			what += " with " + nr.Reason
		}
		mk := dsl.Errorf
		if warn {
			mk = dsl.Warnf
		}
		return mk(n.Pos, "%s: the CPU target has no kernels for %s yet", n.Name, what)
	}
	return nil
}
