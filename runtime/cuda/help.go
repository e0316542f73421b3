//go:build cuda

package cuda

import (
	"fmt"
	"io"
)

// HelpNote is what a trainer built for CUDA adds to its -h.
const HelpNote = `This trainer was built for CUDA (go build -tags cuda): it starts the CUDA
driver before main and stops, saying so, on a machine without an NVIDIA GPU
and driver. There, build the CPU trainer instead (cnnc build --target cpu).
--device cuda runs on GPU 0; --device auto (the default) falls back to the
CPU emulator when the GPU cannot be opened. CNNC_CUDA_DEBUG=1 synchronises
after every kernel launch, so that a fault names its kernel.
`

// PrintHelpNote writes HelpNote to w when args ask for help (-h, -help,
// --h, --help before any "--").
func PrintHelpNote(args []string, w io.Writer) {
	for _, a := range args {
		switch a {
		case "--":
			return
		case "-h", "-help", "--h", "--help":
			fmt.Fprint(w, HelpNote+"\n")
			return
		}
	}
}
