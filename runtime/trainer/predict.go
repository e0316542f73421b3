package trainer

import (
	"fmt"
	"math"
	"sort"
	"time"

	"github.com/cnnc/cnnc/runtime/device"
)

// Prediction is a class and the model's probability for it.
type Prediction struct {
	Class int
	Prob  float64
	// Name is the class's name, when the model knows it (Model.Predict
	// after training on named classes or loading a checkpoint that has
	// them); "" otherwise.
	Name string
}

// Predict runs the forward pass (dropout off) on the images in pixels
// (uint8 HWC, one after the other) and returns, per image, the k most
// probable classes with their softmax probabilities, most probable first
// (equal probabilities: lower class first).
func (s *Session) Predict(pixels []uint8, k int) ([][]Prediction, error) {
	sp := s.Spec
	size := sp.H * sp.W * sp.C
	if len(pixels) == 0 || len(pixels)%size != 0 {
		return nil, fmt.Errorf("trainer: Predict takes whole %dx%dx%d images (%d bytes each), got %d bytes", sp.H, sp.W, sp.C, size, len(pixels))
	}
	if k < 1 || k > sp.Classes {
		return nil, fmt.Errorf("trainer: Predict: k must be 1 to %d (the classes), got %d", sp.Classes, k)
	}
	if sp.Eval.Logits.Shape == nil {
		return nil, fmt.Errorf("trainer: model %s was generated without its logits' place: regenerate it with this cnnc", sp.Model)
	}
	if err := s.ensureEvalArena(); err != nil {
		return nil, err
	}
	if err := s.ensureEvalFolds(); err != nil {
		return nil, err
	}
	n, chunk := len(pixels)/size, s.evalChunk()
	out := make([][]Prediction, 0, n)
	for first := 0; first < n; first += chunk {
		c := min(chunk, n-first)
		b := Batch{Pixels: pixels[first*size : (first+c)*size], Labels: make([]int32, c), Valid: c}
		if err := s.uploadAs(sp.Eval, b, chunk); err != nil {
			return nil, err
		}
		if err := s.run(sp.Eval, c); err != nil {
			return nil, fmt.Errorf("prediction: %w", err)
		}
		logits, err := s.ReadTensor(sp.Eval.Logits)
		if err != nil {
			return nil, err
		}
		for i := 0; i < c; i++ {
			out = append(out, topK(logits[i*sp.Classes:(i+1)*sp.Classes], k))
		}
	}
	return out, nil
}

// topK is the softmax of logits (in float64, stably: shifted by the
// maximum) and its k largest entries.
func topK(logits []float32, k int) []Prediction {
	hi := math.Inf(-1)
	for _, v := range logits {
		hi = math.Max(hi, float64(v))
	}
	ps := make([]Prediction, len(logits))
	var sum float64
	for c, v := range logits {
		e := math.Exp(float64(v) - hi)
		ps[c] = Prediction{Class: c, Prob: e}
		sum += e
	}
	for i := range ps {
		ps[i].Prob /= sum
	}
	sort.SliceStable(ps, func(i, j int) bool { return ps[i].Prob > ps[j].Prob })
	return ps[:k]
}

// LaunchTime is one launch of a profiled step and its time.
type LaunchTime struct {
	Launch Launch
	Time   time.Duration
}

// ProfileStep runs the training step's launches one by one on b, timing
// each: with the device's events where it has them (device.Timer: device
// time only), else with the wall clock around the launch and a sync (the
// CPU emulator's launches are synchronous). The parameters, buffers and
// optimizer state are restored after, so profiling does not change
// training.
func (s *Session) ProfileStep(b Batch) (times []LaunchTime, events bool, err error) {
	s.evalFolded = false // its launches overwrite the arena's temporary space
	saved := map[string][]byte{}
	all := s.Spec.persistent()
	for _, t := range all {
		saved[t.Name] = make([]byte, t.ArenaBytes())
		if err := s.Dev.CopyOut(saved[t.Name], s.addr(t.Arena, t.Offset)); err != nil {
			return nil, false, err
		}
	}
	if err := s.upload(s.Spec.Train, b); err != nil {
		return nil, false, err
	}
	timer, events := s.Dev.(device.Timer)
	for _, l := range s.Spec.Train.Launches {
		one := Step{Launches: []Launch{l}}
		var d time.Duration
		if events {
			d, err = timer.TimeLaunches(func() error { return s.run(one, b.Valid) })
		} else {
			t0 := time.Now()
			err = s.run(one, b.Valid)
			d = time.Since(t0)
		}
		if err != nil {
			return nil, false, err
		}
		times = append(times, LaunchTime{Launch: l, Time: d})
	}
	for _, t := range all {
		if err := s.Dev.CopyIn(s.addr(t.Arena, t.Offset), saved[t.Name]); err != nil {
			return nil, false, err
		}
	}
	return times, events, nil
}
