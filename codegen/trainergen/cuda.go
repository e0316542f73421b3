package trainergen

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/dave/jennifer/jen"

	"github.com/cnnc/cnnc/internal/gentext"
	"github.com/cnnc/cnnc/runtime/trainer"
	"github.com/cnnc/cnnc/runtime/trainer/cli"
	"github.com/cnnc/cnnc/runtime/trainer/cli/early"
)

const (
	cudaPkg   = "github.com/cnnc/cnnc/runtime/cuda"
	devicePkg = "github.com/cnnc/cnnc/runtime/device"
)

// CUDATags are the build tags of a CUDA trainer module (GoBuild's tags).
var CUDATags = []string{"cuda"}

// MainFileCUDA renders a trainer's main for the CUDA target: it embeds the
// kernels twice, as the fatbin runtime/cuda loads (kernels.fatbin, from
// CompileFatbin) and as CUDA C for the CPU emulator (kernels.cu), and
// registers both backends, "cuda" and "cpu". The file itself has no build
// constraint, but the module builds only with -tags cuda (runtime/cuda's
// files carry it); the binary links the CUDA driver and so exits at start
// on a machine without a GPU, after answering --help and --version (its
// help package, HelpFile).
func MainFileCUDA(spec *trainer.Spec) ([]byte, error) {
	f := jen.NewFile("main")
	f.HeaderComment(header(spec.Source))
	for _, line := range []string{
		fmt.Sprintf("Command %s trains model %s on an NVIDIA GPU (or the CPU emulator).", gentext.Comment(strings.ToLower(spec.Model)), gentext.Comment(spec.Model)),
		"",
		"Build with `go build -tags cuda`: the binary links the CUDA driver",
		"(gorgonia.org/cu), whose initialisation exits the process on a machine",
		"without an NVIDIA GPU; build the CPU trainer there instead.",
	} {
		f.PackageComment(line)
	}
	f.ImportName(trainerPkg, "trainer")
	f.ImportName(cliPkg, "cli")
	f.ImportName(cpuPkg, "cpu")
	f.ImportName(cudaPkg, "cuda")
	f.ImportName(devicePkg, "device")
	f.Anon(modulePath(spec) + "/help")
	embedFile(f, "kernels", "kernels.cu")
	embedFile(f, "fatbin", "kernels.fatbin")
	open := func(body jen.Code) jen.Code {
		return jen.Func().Params(jen.Id("spec").Op("*").Qual(trainerPkg, "Spec")).Params(jen.Qual(devicePkg, "Device"), jen.Error()).Block(body)
	}
	f.Func().Id("main").Params().Block(
		jen.Id("backends").Op(":=").Qual(trainerPkg, "Backends").Values(jen.Dict{
			jen.Lit("cuda"): open(jen.Return(jen.Qual(cudaPkg, "New").Call(jen.Id("fatbin")))),
			jen.Lit("cpu"):  open(jen.Return(jen.Qual(cpuPkg, "New").Call(jen.Id("kernels"), jen.Lit("kernels.cu"), jen.Qual(cpuPkg, "Options").Values()))),
		}),
		jen.Qual("os", "Exit").Call(jen.Qual(cliPkg, "Main").Call(jen.Id("Spec"), jen.Id("backends"), jen.Qual("os", "Args").Index(jen.Lit(1).Op(":")), jen.Qual("os", "Stdout"), jen.Qual("os", "Stderr"))),
	)
	return render(f)
}

// HelpFile renders help/help.go of a CUDA trainer module: package help,
// whose init prints the trainer's --help or --version (baked in here,
// from runtime/trainer/cli) through runtime/trainer/cli/early before the
// CUDA driver's initialisation can exit the process (see early's doc for
// why it runs first).
func HelpFile(spec *trainer.Spec) ([]byte, error) {
	f := jen.NewFile("help")
	f.HeaderComment(header(spec.Source))
	f.PackageComment("Package help answers the trainer's --help and --version before the CUDA driver starts,")
	f.PackageComment("so that they work on a machine without a GPU (see runtime/trainer/cli/early).")
	f.ImportName(earlyPkg, "early")
	var flags []jen.Code
	for _, name := range cli.ValueFlags(spec) {
		flags = append(flags, jen.Lit(name))
	}
	f.Func().Id("init").Params().Block(
		jen.Qual(earlyPkg, "Handle").Call(jen.Id("help"), jen.Id("version"), jen.Index().String().Values(flags...)),
	)
	f.Comment("help is the trainer's --help, for the program named early.ProgramPlaceholder.")
	f.Const().Id("help").Op("=").Lit(cli.HelpText(spec, true, early.ProgramPlaceholder))
	f.Comment("version is the trainer's --version.")
	f.Const().Id("version").Op("=").Lit(cli.VersionText(spec))
	return render(f)
}

// WriteModuleCUDA writes a trainer module for the CUDA target into dir:
// what WriteModule writes (spec.go, kernels.cu, go.mod, go.sum and the
// runtime's source), with main.go from MainFileCUDA, help/help.go from
// HelpFile and the kernels' fatbin (CompileFatbin of the same kernels) as
// kernels.fatbin. Build it
// with GoBuild(dir, output, CUDATags, log).
func WriteModuleCUDA(dir string, spec *trainer.Spec, kernels, fatbin []byte) error {
	if len(fatbin) == 0 {
		return fmt.Errorf("trainergen: a CUDA trainer needs the kernels' fatbin (CompileFatbin)")
	}
	mainSrc, err := MainFileCUDA(spec)
	if err != nil {
		return err
	}
	if err := WriteModule(dir, spec, kernels); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "main.go"), mainSrc, 0o644); err != nil {
		return err
	}
	helpSrc, err := HelpFile(spec)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Join(dir, "help"), 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "help", "help.go"), helpSrc, 0o644); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "kernels.fatbin"), fatbin, 0o644)
}
