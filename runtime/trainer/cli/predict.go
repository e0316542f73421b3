package cli

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"

	"github.com/cnnc/cnnc/runtime/data"
	"github.com/cnnc/cnnc/runtime/regularfile"
	"github.com/cnnc/cnnc/runtime/trainer"
)

// predictOptions are `TRAINER predict`'s flags.
type predictOptions struct {
	checkpoint, device string
	top                int
	json               bool
}

// predictCommand is `TRAINER predict --checkpoint CK [--top K] [--json]
// IMAGE_OR_DIR...`: each image file's most probable classes.
func predictCommand(spec *trainer.Spec, backends trainer.Backends, o *options, code *int) *cobra.Command {
	po := &predictOptions{}
	cmd := &cobra.Command{
		Use:   o.programName + " predict --checkpoint CK [--top K] [--json] IMAGE_OR_DIR...",
		Short: fmt.Sprintf("predict the classes of images with a trained %s", spec.Model),
		Long: fmt.Sprintf(`Predicts the classes of image files with the parameters of a checkpoint (a
--checkpoint or --keep-best of %s's trainer%s). A folder stands for the image
files under it (.jpg .jpeg .png .gif .bmp .webp .tif .tiff, in any case; by
path, sub-folders included, links to folders not followed). Each image is
decoded, converted to %s and resized to %dx%d exactly as the training
data's images are. For each file the --top classes are printed with their
probabilities (the softmax of the logits), named as the checkpoint's
training data named them (an ImageFolder's folder names, MNIST's digits).
A file that cannot be read or decoded is named on stderr and skipped; then
the exit status is 1 (2: a bad command line).`, spec.Model, inferNote(spec), channelsWord(spec.C), spec.H, spec.W),
		SilenceUsage:  true,
		SilenceErrors: true,
		RunE: func(cmd *cobra.Command, args []string) error {
			var err error
			*code, err = predict(spec, backends, o, po, args)
			switch {
			case err != nil && *code == ExitUsage:
				fmt.Fprintf(o.stderr, "%s predict: %v; see %s predict --help\n", o.programName, err, o.programName)
			case err != nil:
				fmt.Fprintf(o.stderr, "%s predict: %v\n", o.programName, err)
			}
			return nil
		},
	}
	cmd.SetOut(o.stdout)
	cmd.SetErr(o.stderr)
	cmd.SetFlagErrorFunc(FlagError)
	fs := cmd.Flags()
	fs.SortFlags = false
	fs.StringVar(&po.checkpoint, "checkpoint", "", "the trained parameters: a checkpoint this trainer wrote (required)")
	fs.IntVar(&po.top, "top", min(3, spec.Classes), fmt.Sprintf("how many of the most probable classes to print per image (1 to %d)", spec.Classes))
	fs.BoolVar(&po.json, "json", false, "print one JSON object per file: {\"file\", \"top\": [{\"class\", \"name\", \"probability\"}]}, or {\"file\", \"error\"}")
	fs.StringVar(&po.device, "device", "auto", "auto, cpu or cuda")
	fs.BoolP("help", "h", false, "help for predict") // cobra's would name the trainer
	return cmd
}

// input is one image file to predict, or why it cannot be.
type input struct {
	path string
	err  error
	pix  []uint8
}

// predict runs `predict` and returns the exit code.
func predict(spec *trainer.Spec, backends trainer.Backends, o *options, po *predictOptions, args []string) (int, error) {
	switch {
	case len(args) == 0:
		return ExitUsage, errors.New("give the image files or folders to predict")
	case po.checkpoint == "":
		return ExitUsage, errors.New("--checkpoint is needed: the trained parameters to predict with")
	case po.top < 1 || po.top > spec.Classes:
		return ExitUsage, fmt.Errorf("--top %d: want 1 to %d (the model's classes)", po.top, spec.Classes)
	case po.device != "auto" && po.device != "cpu" && po.device != "cuda":
		return ExitUsage, fmt.Errorf("--device %s: want auto, cpu or cuda", po.device)
	case po.device != "auto" && backends[po.device] == nil:
		return ExitUsage, fmt.Errorf("--device %s: this trainer was built without it (cnnc build --target cuda builds a CUDA trainer)", po.device)
	}
	m, err := openTrained(spec, backends, po)
	if err != nil {
		return ExitError, err
	}
	defer m.Close()
	inputs := collectImages(args)
	shape := data.Shape{H: spec.H, W: spec.W, C: spec.C}
	var pixels []uint8
	for i := range inputs {
		in := &inputs[i]
		if in.err == nil {
			if in.pix, in.err = data.LoadImage(in.path, shape); in.err == nil {
				pixels = append(pixels, in.pix...)
			}
		}
	}
	var preds [][]trainer.Prediction
	if len(pixels) > 0 {
		if preds, err = m.Predict(pixels, po.top); err != nil {
			return ExitError, err
		}
	}
	return reportPredictions(o, po, m.Classes(), inputs, preds)
}

// openTrained opens the model on --device with --checkpoint's parameters.
func openTrained(spec *trainer.Spec, backends trainer.Backends, po *predictOptions) (*trainer.Model, error) {
	f, _, err := regularfile.Open(po.checkpoint)
	if err != nil {
		return nil, fmt.Errorf("--checkpoint: %w", err)
	}
	defer f.Close()
	m, err := trainer.NewModel(spec, backends, trainer.Options{Device: po.device})
	if err != nil {
		return nil, err
	}
	if err := m.Load(f); err != nil {
		m.Close()
		return nil, fmt.Errorf("--checkpoint %s: %w", po.checkpoint, err)
	}
	return m, nil
}

// collectImages lists the files the arguments name, in order: a file as
// it is, a folder as the image files under it (by path).
func collectImages(args []string) []input {
	var out []input
	for _, arg := range args {
		info, err := os.Stat(arg)
		if err != nil || !info.IsDir() {
			out = append(out, input{path: arg}) // LoadImage says what is wrong
			continue
		}
		before := len(out)
		err = filepath.WalkDir(arg, func(path string, d fs.DirEntry, err error) error {
			switch {
			case err != nil:
				out = append(out, input{path: path, err: err})
				if d != nil && d.IsDir() {
					return fs.SkipDir
				}
			case !d.IsDir() && data.IsImageFile(path):
				out = append(out, input{path: path})
			}
			return nil
		})
		if err == nil && len(out) == before {
			out = append(out, input{path: arg, err: &data.FileError{Path: arg, Err: errors.New("no image files in this folder")}})
		}
	}
	return out
}

// predictionJSON is one line of --json.
type predictionJSON struct {
	File  string      `json:"file"`
	Top   []classJSON `json:"top,omitempty"`
	Error string      `json:"error,omitempty"`
}

type classJSON struct {
	Class int     `json:"class"`
	Name  string  `json:"name"`
	Prob  float64 `json:"probability"`
}

// reportPredictions prints each input's prediction (stdout) or error
// (stderr, and in --json's stream), in the arguments' order, and ends
// with the count of bad files.
func reportPredictions(o *options, po *predictOptions, names []string, inputs []input, preds [][]trainer.Prediction) (int, error) {
	enc := json.NewEncoder(o.stdout)
	var bad []string
	next := 0
	for _, in := range inputs {
		if in.err != nil {
			bad = append(bad, in.path)
			msg := in.err.Error()
			var fe *data.FileError
			if !errors.As(in.err, &fe) && !strings.HasPrefix(msg, in.path) {
				msg = in.path + ": " + msg
			}
			fmt.Fprintf(o.stderr, "%s predict: skipped %s\n", o.programName, msg)
			if po.json {
				if err := enc.Encode(predictionJSON{File: in.path, Error: msg}); err != nil {
					return ExitError, err
				}
			}
			continue
		}
		top := preds[next]
		next++
		if po.json {
			line := predictionJSON{File: in.path}
			for _, p := range top {
				line.Top = append(line.Top, classJSON{Class: p.Class, Name: trainer.ClassName(names, p.Class), Prob: p.Prob})
			}
			if err := enc.Encode(line); err != nil {
				return ExitError, err
			}
			continue
		}
		parts := make([]string, len(top))
		for i, p := range top {
			parts[i] = fmt.Sprintf("%s (%.2f%%)", trainer.ClassName(names, p.Class), 100*p.Prob)
		}
		if _, err := fmt.Fprintf(o.stdout, "%s: %s\n", in.path, strings.Join(parts, ", ")); err != nil {
			return ExitError, err
		}
	}
	if len(bad) > 0 {
		return ExitError, fmt.Errorf("%d of %d files could not be read: %s", len(bad), len(inputs), strings.Join(bad, ", "))
	}
	return ExitOK, nil
}

// inferNote says what an inference-only build computes, for predict's help.
func inferNote(spec *trainer.Spec) string {
	if !spec.Infer {
		return ""
	}
	return "; this inference build runs forward kernels only, each batch norm after\na conv folded into the conv's weight and bias when the checkpoint is loaded"
}
