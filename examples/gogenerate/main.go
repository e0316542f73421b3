package main

import (
	"flag"
	"fmt"
	"os"

	"github.com/cnnc/cnnc/examples/gogenerate/mnistnet"
	"github.com/cnnc/cnnc/runtime/data"
)

func main() {
	dir := flag.String("mnist", "data/mnist", "folder with MNIST's IDX files")
	steps := flag.Int("steps", 200, "training steps")
	flag.Parse()
	if err := run(*dir, *steps); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

// run trains for steps batches of the training set, then evaluates on the
// first 1024 test digits.
func run(dir string, steps int) error {
	train, err := data.LoadMNIST(dir, "train")
	if err != nil {
		return err
	}
	test, err := data.LoadMNIST(dir, "t10k")
	if err != nil {
		return err
	}
	m, err := mnistnet.New(mnistnet.Options{Seed: 1})
	if err != nil {
		return err
	}
	defer m.Close()
	for s := 0; s < steps; s++ {
		loss, correct, err := m.TrainStep(batch(train, s*mnistnet.BatchSize))
		if err != nil {
			return err
		}
		if s%50 == 0 || s == steps-1 {
			fmt.Printf("step %d: loss %.4f, %d/%d correct\n", s, loss, correct, mnistnet.BatchSize)
		}
	}
	right, seen := 0, 0
	for i := 0; i < 1024; i += mnistnet.BatchSize {
		_, c, err := m.Evaluate(batch(test, i))
		if err != nil {
			return err
		}
		right += c
		seen += mnistnet.BatchSize
	}
	fmt.Printf("test accuracy on %d digits: %.1f%%\n", seen, float64(right)/float64(seen)*100)
	return nil
}

// batch takes Batch consecutive samples from first (wrapping around).
func batch(ds *data.MNIST, first int) mnistnet.Batch {
	b := mnistnet.Batch{Valid: mnistnet.BatchSize}
	for i := 0; i < mnistnet.BatchSize; i++ {
		k := (first + i) % ds.Len()
		b.Pixels = append(b.Pixels, ds.Images.Image(k)...)
		b.Labels = append(b.Labels, int32(ds.Labels[k]))
	}
	return b
}
