package trainer

import (
	"fmt"
	"strconv"
)

// Best follows a test metric over a run's epochs: the best value so far,
// the epoch that gave it, and the epochs since (for early stopping). Loop
// observes every whole epoch's test evaluation with it; checkpoints carry
// its state (Meta), so that a resumed run goes on counting.
type Best struct {
	// By is the metric: "accuracy" (the test accuracy: higher is better)
	// or "loss" (the test loss: lower is better).
	By string
	// Patience stops the run after this many epochs in a row without an
	// improvement; 0: never.
	Patience int

	// Value is the best value so far, from epoch Epoch (from 1; 0: no
	// epoch observed yet); Stale counts the epochs since, in a row.
	Value float64
	Epoch int
	Stale int
}

// Metrics Best can follow.
const (
	ByAccuracy = "accuracy"
	ByLoss     = "loss"
)

// Metadata keys of Best's state in checkpoints.
const (
	metaBestBy    = "best_by"
	metaBestValue = "best_value"
	metaBestEpoch = "best_epoch"
	metaBestStale = "best_stale"
)

// NewBest follows the metric by ("accuracy" or "loss"), stopping after
// patience epochs without improvement (0: never).
func NewBest(by string, patience int) (*Best, error) {
	if by != ByAccuracy && by != ByLoss {
		return nil, fmt.Errorf("%q: the best epoch is chosen by %s or %s (of the test data)", by, ByAccuracy, ByLoss)
	}
	if patience < 0 {
		return nil, fmt.Errorf("patience %d: want 0 (never stop early) or more epochs", patience)
	}
	return &Best{By: by, Patience: patience}, nil
}

// value is e's metric.
func (b *Best) value(e EpochMetrics) float64 {
	if b.By == ByLoss {
		return e.TestLoss
	}
	return e.TestAcc
}

// Observe takes a whole epoch's metrics and says whether its metric
// improved on the best so far (strictly: a tie is no improvement). The
// first epoch observed always improves.
func (b *Best) Observe(e EpochMetrics) bool {
	v := b.value(e)
	better := b.Epoch == 0 || (b.By == ByLoss && v < b.Value) || (b.By == ByAccuracy && v > b.Value)
	if better {
		b.Value, b.Epoch, b.Stale = v, e.Epoch, 0
	} else {
		b.Stale++
	}
	return better
}

// Exhausted says whether patience has run out: Patience epochs in a row
// without an improvement.
func (b *Best) Exhausted() bool { return b.Patience > 0 && b.Stale >= b.Patience }

// Describe says what the best is, e.g. "test accuracy 0.9712 at epoch 3".
func (b *Best) Describe() string {
	if b.Epoch == 0 {
		return "no epoch evaluated yet"
	}
	return fmt.Sprintf("test %s %.6g at epoch %d", b.By, b.Value, b.Epoch)
}

// Meta is the state as checkpoint metadata.
func (b *Best) Meta() map[string]string {
	if b.Epoch == 0 {
		return map[string]string{metaBestBy: b.By}
	}
	return map[string]string{
		metaBestBy: b.By, metaBestValue: strconv.FormatFloat(b.Value, 'g', -1, 64),
		metaBestEpoch: strconv.Itoa(b.Epoch), metaBestStale: strconv.Itoa(b.Stale),
	}
}

// Restore takes the state a checkpoint's metadata holds, when it followed
// the same metric; it says whether it did. A malformed state is an error
// naming the key.
func (b *Best) Restore(meta map[string]string) (bool, error) {
	if meta[metaBestBy] != b.By {
		return false, nil
	}
	if _, ok := meta[metaBestEpoch]; !ok {
		return true, nil // followed, nothing evaluated yet
	}
	v, err := strconv.ParseFloat(meta[metaBestValue], 64)
	if err != nil {
		return false, fmt.Errorf("metadata %q = %q is not a number", metaBestValue, meta[metaBestValue])
	}
	epoch, err := strconv.Atoi(meta[metaBestEpoch])
	if err != nil || epoch < 1 {
		return false, fmt.Errorf("metadata %q = %q is not an epoch", metaBestEpoch, meta[metaBestEpoch])
	}
	stale, err := strconv.Atoi(meta[metaBestStale])
	if err != nil || stale < 0 {
		return false, fmt.Errorf("metadata %q = %q is not a count", metaBestStale, meta[metaBestStale])
	}
	b.Value, b.Epoch, b.Stale = v, epoch, stale
	return true, nil
}

// FollowedBy is the metric a checkpoint's Best followed ("" if none).
func FollowedBy(meta map[string]string) string { return meta[metaBestBy] }
