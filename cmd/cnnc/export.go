package main

import (
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/spf13/cobra"

	"github.com/cnnc/cnnc/export/onnx"
	"github.com/cnnc/cnnc/runtime/checkpoint"
	"github.com/cnnc/cnnc/runtime/trainer"
	"github.com/cnnc/cnnc/runtime/units"
	"github.com/cnnc/cnnc/runtime/version"
)

func newExportCmd(stdout, stderr io.Writer) *cobra.Command {
	// the exporter reads the forward IR: shapes and dce, nothing after
	f := compileFlags{stopAfter: "dce"}
	var out, ck string
	cmd := &cobra.Command{
		Use:   "export --onnx OUT.onnx --checkpoint CK FILE",
		Short: "export a trained model as ONNX, for inference outside cnnc",
		Long: `export writes the model FILE with the parameters of checkpoint CK (a
trainer's --checkpoint) as a standard ONNX model (opset 13):

  input  "image":  float32 [batch, C, H, W], pixels in [0,1] as torchvision's
                   ToTensor gives them (the batch dimension is dynamic)
  output "logits": float32 [batch, classes], the inputs of the loss

The graph computes what the trainer's evaluation computes from the same
images: dropout is the identity, the loss is left out (and so are layers
the loss does not need). The data block's deterministic preprocessing
after ToTensor would be part of the graph; today there is none. The
initializers carry the checkpoint's state_dict names (conv1.weight, ...)
and its float32 values unchanged; optimizer state is not exported.`,
		Example: "  cnnc export --onnx mnist.onnx --checkpoint mnist.safetensors examples/mnist.cnn",
		Args:    exactlyOneFile,
		RunE: func(cmd *cobra.Command, args []string) error {
			if out == "" || ck == "" {
				fmt.Fprintf(stderr, "cnnc export: --onnx OUT.onnx and --checkpoint CK are required\nusage: %s\n", cmd.UseLine())
				return exitError{exitUsage}
			}
			res, err := loadModel(args[0], &f, stdout, stderr)
			if err != nil {
				return err
			}
			file, err := checkpoint.Read(ck)
			if err != nil {
				fmt.Fprintf(stderr, "cnnc export: --checkpoint: %v\n", err)
				return exitError{exitModel}
			}
			meta := map[string]string{"cnnc.model": res.Graph.Name, "cnnc.source": filepath.Base(args[0])}
			if step, ok := file.Metadata[trainer.MetaStep]; ok {
				meta["cnnc.checkpoint_step"] = step
			}
			m, err := onnx.Export(res.Graph, onnx.FromCheckpoint(file), onnx.Options{
				Preprocess:      onnx.PreprocessFor(res.Data),
				ProducerVersion: version.Get().Version,
				DocString:       fmt.Sprintf("%s from %s with the parameters of %s, exported by %s", res.Graph.Name, filepath.Base(args[0]), filepath.Base(ck), version.Get()),
				Metadata:        meta,
			})
			if err != nil {
				src, _ := os.ReadFile(args[0])
				printDiagnostics(stderr, err, map[string][]byte{args[0]: src})
				return exitError{exitModel}
			}
			data := m.Marshal()
			if err := onnx.WriteFile(out, data); err != nil {
				fmt.Fprintf(stderr, "cnnc export: --onnx: %v\n", err)
				return exitError{exitModel}
			}
			in, lg := m.Graph.Inputs[0].Dims, m.Graph.Outputs[0].Dims
			fmt.Fprintf(stdout, "wrote %s (%s): %s, %d ONNX nodes, %d initializers, opset %d; input %s float32[batch,%d,%d,%d] in [0,1], output %s float32[batch,%d]\n",
				out, units.FormatBytes(int64(len(data))), res.Graph.Name, len(m.Graph.Nodes), len(m.Graph.Initializer), onnx.OpsetVersion,
				onnx.InputName, in[1], in[2], in[3], onnx.OutputName, lg[1])
			return nil
		},
	}
	cmd.Flags().StringVar(&out, "onnx", "", "the ONNX model `OUT` to write")
	cmd.Flags().StringVar(&ck, "checkpoint", "", "the checkpoint `CK` whose parameters the model carries (a trainer's --checkpoint)")
	return cmd
}
