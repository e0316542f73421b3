package main

import (
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/spf13/cobra"

	"github.com/cnnc/cnnc/compiler"
	"github.com/cnnc/cnnc/compiler/ir"
	"github.com/cnnc/cnnc/compiler/plan"
	"github.com/cnnc/cnnc/driver"
	"github.com/cnnc/cnnc/dsl"
	"github.com/cnnc/cnnc/runtime/trainer/cli"
	"github.com/cnnc/cnnc/runtime/version"
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
the optimizer update, plans every byte of device memory statically
(recomputing or micro-batching to fit a budget), and emits CUDA kernels
plus a standalone Go trainer (cnnc build) or a Go package (cnnc gen).`,
		Version:       version.Get().String(),
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.SetVersionTemplate("{{.Version}}\n")
	// flag errors read as the trainers' do: one line naming the flag and
	// what it wants (or the flag meant), and where help is
	root.SetFlagErrorFunc(func(cmd *cobra.Command, err error) error {
		return fmt.Errorf("%w; see %s --help", cli.FlagError(cmd, err), cmd.CommandPath())
	})
	root.SetOut(stdout)
	root.SetErr(stderr)
	root.AddCommand(newCheckCmd(stdout, stderr), newPassesCmd(stdout), newVersionCmd(stdout))
	root.AddCommand(newPlanCmd(stdout, stderr))
	root.AddCommand(newBuildCmd(stdout, stderr))
	root.AddCommand(newGenCmd(stdout, stderr))
	root.AddCommand(newExportCmd(stdout, stderr))
	return root
}

func newVersionCmd(stdout io.Writer) *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "print cnnc's version, commit and Go release (as --version does)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			fmt.Fprintln(stdout, version.Get().String())
			return nil
		},
	}
}

// compileFlags are shared by the commands that compile a model.
type compileFlags struct {
	batch     int64
	dumpAfter string
	disable   []string
	stopAfter string                            // the last pass to run (export needs only the forward IR)
	infer     bool                              // compile for inference (--infer: build, plan)
	flags     interface{ Changed(string) bool } // to tell --batch given from its default
}

// registerInfer adds --infer.
func (f *compileFlags) registerInfer(cmd *cobra.Command, usage string) {
	cmd.Flags().BoolVar(&f.infer, "infer", false, usage)
}

func (f *compileFlags) register(cmd *cobra.Command) {
	f.registerBatch(cmd, "the batch size (default: the train block's, else 32)")
	cmd.Flags().StringVar(&f.dumpAfter, "dump-after", "", "print the IR text after `PASS` (or \"all\": after every pass) and stop there")
	cmd.Flags().StringSliceVar(&f.disable, "disable", nil, "skip the optional `PASSES` (comma-separated; cnnc passes lists them)")
}

// registerBatch adds --batch N.
func (f *compileFlags) registerBatch(cmd *cobra.Command, usage string) {
	cmd.Flags().Int64Var(&f.batch, "batch", 0, strings.Replace(usage, "batch size", "batch size `N`", 1))
	f.flags = cmd.Flags()
}

// maxShown bounds the diagnostics printed (a generated model may have
// thousands of unused layers): the rest are counted.
const maxShown = 100

// loadModel reads, parses and compiles a model file, printing diagnostics
// (errors and warnings) with their source lines to stderr.
func loadModel(path string, f *compileFlags, stdout, stderr io.Writer) (*compiler.Result, error) {
	if f.flags != nil && f.flags.Changed("batch") && (f.batch < 1 || f.batch > compiler.MaxBatch) {
		fmt.Fprintf(stderr, "cnnc: --batch %d: the batch must be between 1 and %s\n", f.batch, compiler.Commas(compiler.MaxBatch))
		return nil, exitError{exitUsage}
	}
	src, err := dsl.ReadFile(path)
	if err != nil {
		fmt.Fprintf(stderr, "cnnc: %s\n", dsl.Printable(err.Error()))
		return nil, exitError{exitModel}
	}
	sources := map[string][]byte{path: src}
	opts := compiler.Options{Batch: f.batch, BatchSource: "--batch", Disable: f.disable, StopAfter: f.stopAfter, Infer: f.infer}
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
	res, err := driver.Load(path, src, opts)
	if err != nil { // a syntax or model error (diagnostics), or a bad option
		var ds dsl.Diagnostics
		if !errors.As(err, &ds) {
			fmt.Fprintf(stderr, "cnnc: %v\n", err)
			return nil, exitError{exitUsage}
		}
		printDiagnostics(stderr, err, sources)
		return nil, exitError{exitModel}
	}
	if f.dumpAfter == "" {
		// what the trainers need beyond the language, so that every
		// command refuses at the line what cnnc build would refuse
		if ds := compiler.CheckTrainable(res); len(ds) > 0 {
			printDiagnostics(stderr, ds, sources)
			return nil, exitError{exitModel}
		}
	}
	if len(res.Warnings) > 0 {
		fmt.Fprint(stderr, renderCapped(res.Warnings, sources))
	}
	return res, nil
}

func printDiagnostics(w io.Writer, err error, sources map[string][]byte) {
	var ds dsl.Diagnostics
	if errors.As(err, &ds) {
		fmt.Fprint(w, renderCapped(ds, sources))
		if n := len(ds.Errors()); n > 1 {
			fmt.Fprintf(w, "%d errors\n", n)
		}
		return
	}
	fmt.Fprintf(w, "cnnc: %s\n", dsl.Printable(err.Error()))
}

// renderCapped renders the first maxShown diagnostics and counts the rest.
func renderCapped(ds dsl.Diagnostics, sources map[string][]byte) string {
	if len(ds) <= maxShown {
		return ds.RenderAll(sources)
	}
	rest := ds[maxShown:]
	errs := len(rest.Errors())
	return ds[:maxShown].RenderAll(sources) + fmt.Sprintf("... and %d more (%d errors, %d warnings) not shown\n", len(rest), errs, len(rest)-errs)
}

func newCheckCmd(stdout, stderr io.Writer) *cobra.Command {
	var f compileFlags
	cmd := &cobra.Command{
		Use:   "check FILE",
		Short: "check a model and print its summary: shapes, parameters, FLOPs",
		Long: `check parses FILE, infers and checks every tensor shape, derives the
backward pass, plans the step's memory (for the train block's budget) and
generates its kernels — everything cnnc build does but running nvcc and
go build, so that check refuses what build would — and prints a summary
table (layer, op, output shape, parameters, forward FLOPs) with totals.
Errors name the file, line and column and show the line with a caret;
the exit status is 1.`,
		Example: "  cnnc check examples/simplecnn.cnn\n  cnnc check --dump-after=autodiff examples/mnist.cnn\n  cnnc check --infer --dump-after=bnfold examples/vgg_small.cnn",
		Args:    exactlyOneFile,
		RunE: func(cmd *cobra.Command, args []string) error {
			res, err := loadModel(args[0], &f, stdout, stderr)
			if err != nil {
				return err
			}
			if f.dumpAfter != "" {
				return nil
			}
			// everything cnnc build does before nvcc: the memory plan (for
			// the train block's budget) and the kernels — unless passes
			// build always runs were disabled, which no build does
			compile := func() error {
				_, err := driver.Compile(res, driver.Budget(res, res.Train.MemoryBudget, ""), driver.CUDA)
				return err
			}
			if f.infer { // what cnnc build --infer does before go build
				compile = func() error { _, err := driver.CompileInfer(res, plan.Config{}, driver.CUDA); return err }
			}
			if len(f.disable) == 0 {
				if err := compile(); err != nil {
					return backendError(args[0], res, err, stderr)
				}
			}
			res.Summary.Print(stdout)
			return nil
		},
	}
	f.register(cmd)
	f.registerInfer(cmd, "check the inference compilation (cnnc build --infer): passes infer and bnfold instead of autodiff, forward kernels only")
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
				if p.Mode != compiler.BothModes {
					req += ", " + p.Mode.String() + " only"
				}
				fmt.Fprintf(stdout, "%-10s %-24s %s\n", p.Name, req, p.Doc)
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
