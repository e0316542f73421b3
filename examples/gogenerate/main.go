package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"

	"github.com/cnnc/cnnc/examples/gogenerate/mnistnet"
	"github.com/cnnc/cnnc/runtime/data"
)

func main() {
	dir := flag.String("mnist", "data/mnist", "folder with MNIST's IDX files")
	steps := flag.Int64("steps", 200, "training steps")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, *dir, *steps); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

// run trains for steps batches of the training set (Ctrl-C stops it
// early), evaluates on the test set and shows what the model predicts for
// the first test digit.
func run(ctx context.Context, dir string, steps int64) error {
	train, err := data.LoadMNIST(dir, "train")
	if err != nil {
		return err
	}
	test, err := data.LoadMNIST(dir, "t10k")
	if err != nil {
		return err
	}
	m, err := mnistnet.New(mnistnet.Options{Seed: 1, MaxSteps: steps, OnStep: func(s mnistnet.StepMetrics) {
		if s.Step%50 == 0 {
			fmt.Printf("step %d: loss %.4f, %d/%d correct\n", s.Step, s.Loss, s.Correct, s.Size)
		}
	}})
	if err != nil {
		return err
	}
	defer m.Close()
	if err := m.Train(ctx, train); err != nil && ctx.Err() == nil {
		return err
	}
	ev, err := m.Evaluate(context.Background(), test)
	if err != nil {
		return err
	}
	fmt.Printf("after %d steps: test accuracy %.2f%% on %d digits\n", m.Steps(), 100*ev.Accuracy, ev.Samples)
	top, err := m.Predict(test.Images.Image(0), 3)
	if err != nil {
		return err
	}
	fmt.Printf("the first test digit is a %d; the model says:", test.Labels[0])
	for _, p := range top[0] {
		fmt.Printf(" %d (%.1f%%)", p.Class, 100*p.Prob)
	}
	fmt.Println()
	return nil
}
