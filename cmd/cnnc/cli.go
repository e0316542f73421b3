package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/spf13/cobra"

	"github.com/cnnc/cnnc/compiler"
	"github.com/cnnc/cnnc/compiler/ir"
	"github.com/cnnc/cnnc/dsl"
)

// Exit codes.
const (
	exitOK    = 0
	exitModel = 1 // the model (or its data) has errors
	exitUsage = 2 // bad command line
)

// exitError carries an exit code through cobra.
type exitError struct{ code int }

func (e exitError) Error() string { return fmt.Sprintf("exit %d", e.code) }

// run executes the CLI; it never panics on user input and returns the exit code.
func run(args []string, stdout, stderr io.Writer) int {
	root := newRoot(stdout, stderr)
	root.SetArgs(goStyleFlags(args))
	err := root.Execute()
	var ee exitError
	switch {
	case err == nil:
		return exitOK
	case errors.As(err, &ee):
		return ee.code
	default:
		fmt.Fprintf(stderr, "cnnc: %v\n", err)
		return exitUsage
	}
}

func newRoot(stdout, stderr io.Writer) *cobra.Command {
	root := &cobra.Command{
		Use:   "cnnc",
		Short: "cnnc compiles a CNN model description into a minimal-memory trainer",
		Long: `cnnc compiles a small DSL describing a CNN and how to train it.

It checks every shape before anything runs, derives the backward pass and
the optimizer update, and (in later stages) plans all device memory
statically and emits CUDA kernels plus a standalone Go trainer.`,
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.SetOut(stdout)
	root.SetErr(stderr)
	root.AddCommand(newCheckCmd(stdout, stderr), newPassesCmd(stdout))
	root.AddCommand(newPlanCmd(stdout, stderr))
	root.AddCommand(newBuildCmd(stdout, stderr))
	root.AddCommand(newGenCmd(stdout, stderr))
	root.AddCommand(newExportCmd(stdout, stderr))
	return root
}

// compileFlags are shared by the commands that compile a model.
type compileFlags struct {
	batch     int64
	dumpAfter string
	disable   []string
	stopAfter string // the last pass to run (export needs only the forward IR)
}

func (f *compileFlags) register(cmd *cobra.Command) {
	cmd.Flags().Int64Var(&f.batch, "batch", 0, "batch size (default: the train block's, else 32)")
	cmd.Flags().StringVar(&f.dumpAfter, "dump-after", "", "print the IR text after the named pass (or \"all\": after every pass) and stop there")
	cmd.Flags().StringSliceVar(&f.disable, "disable", nil, "optional passes to skip (see `cnnc passes`)")
}

// loadModel reads, parses and compiles a model file, printing diagnostics
// (errors and warnings) with their source lines to stderr.
func loadModel(path string, f *compileFlags, stdout, stderr io.Writer) (*compiler.Result, error) {
	src, err := os.ReadFile(path)
	if err != nil {
		fmt.Fprintf(stderr, "cnnc: %v\n", err)
		return nil, exitError{exitModel}
	}
	sources := map[string][]byte{path: src}
	file, err := dsl.Parse(path, src)
	if err != nil {
		printDiagnostics(stderr, err, sources)
		return nil, exitError{exitModel}
	}
	opts := compiler.Options{Batch: f.batch, Disable: f.disable, StopAfter: f.stopAfter}
	if f.batch < 0 {
		fmt.Fprintf(stderr, "cnnc: --batch must be positive, got %d\n", f.batch)
		return nil, exitError{exitUsage}
	}
	if f.dumpAfter != "" {
		all := f.dumpAfter == "all"
		if !all {
			opts.StopAfter = f.dumpAfter
		}
		opts.AfterPass = func(pass string, g *ir.Graph) error {
			if all || pass == f.dumpAfter {
				fmt.Fprintf(stdout, "# IR after %s\n%s", pass, g.Text())
			}
			return nil
		}
	}
	res, err := compiler.Compile(file, opts)
	if err != nil {
		var ds dsl.Diagnostics
		if !errors.As(err, &ds) {
			fmt.Fprintf(stderr, "cnnc: %v\n", err)
			return nil, exitError{exitUsage}
		}
		printDiagnostics(stderr, err, sources)
		return nil, exitError{exitModel}
	}
	if len(res.Warnings) > 0 {
		fmt.Fprint(stderr, res.Warnings.RenderAll(sources))
	}
	return res, nil
}

func printDiagnostics(w io.Writer, err error, sources map[string][]byte) {
	var ds dsl.Diagnostics
	if errors.As(err, &ds) {
		fmt.Fprint(w, ds.RenderAll(sources))
		if n := len(ds.Errors()); n > 1 {
			fmt.Fprintf(w, "%d errors\n", n)
		}
		return
	}
	fmt.Fprintf(w, "cnnc: %v\n", err)
}

func newCheckCmd(stdout, stderr io.Writer) *cobra.Command {
	var f compileFlags
	cmd := &cobra.Command{
		Use:   "check FILE",
		Short: "check a model and print its summary: shapes, parameters, FLOPs",
		Long: `check parses FILE, infers and checks every tensor shape, derives the
backward pass, and prints a summary table (layer, op, output shape,
parameters, forward FLOPs) with totals. Errors name the file, line and
column and show the line with a caret; the exit status is 1.`,
		Example: "  cnnc check examples/simplecnn.cnn\n  cnnc check --dump-after=autodiff examples/mnist.cnn",
		Args:    exactlyOneFile,
		RunE: func(cmd *cobra.Command, args []string) error {
			res, err := loadModel(args[0], &f, stdout, stderr)
			if err != nil {
				return err
			}
			if f.dumpAfter != "" {
				return nil
			}
			res.Summary.Print(stdout)
			return nil
		},
	}
	f.register(cmd)
	return cmd
}

func newPassesCmd(stdout io.Writer) *cobra.Command {
	return &cobra.Command{
		Use:   "passes",
		Short: "list the compiler passes in order",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			for _, p := range compiler.Passes {
				req := "optional"
				if p.Required {
					req = "required"
				}
				fmt.Fprintf(stdout, "%-10s %-8s %s\n", p.Name, req, p.Doc)
			}
			return nil
		},
	}
}

func exactlyOneFile(cmd *cobra.Command, args []string) error {
	if len(args) != 1 {
		return fmt.Errorf("%s takes one model file, got %d arguments (%s)\nusage: %s", cmd.Name(), len(args), strings.Join(args, " "), cmd.UseLine())
	}
	return nil
}

// goStyleFlags accepts Go-style single-dash long flags (-pkg NAME, as in
// `cnnc gen FILE -o DIR -pkg NAME`) by rewriting them to --pkg.
func goStyleFlags(args []string) []string {
	out := make([]string, len(args))
	for i, a := range args {
		if a == "-pkg" || strings.HasPrefix(a, "-pkg=") {
			a = "-" + a
		}
		out[i] = a
	}
	return out
}
