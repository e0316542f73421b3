package trainergen

import (
	"fmt"
	"go/token"
	"path"

	"github.com/dave/jennifer/jen"

	"github.com/cnnc/cnnc/internal/gentext"
	"github.com/cnnc/cnnc/runtime/trainer"
)

// PackageFiles renders a Go package for a user's project (`cnnc gen`): the
// Spec, the embedded kernels, and New, which returns a runtime/trainer
// Model (the library: Train, Step, Evaluate, Predict, Save, Load, per-step
// metrics) on the package's devices:
//
//	m, err := pkg.New(pkg.Options{Seed: 1, OnStep: func(s pkg.StepMetrics) { ... }})
//	err = m.Train(ctx, dataset)               // data.LoadMNIST, data.OpenImageFolder, ...
//	ev, err := m.Evaluate(ctx, testset)
//	top, err := m.Predict(pixels, 3)           // per image its 3 most probable classes: Class, Prob, Name
//	err = m.Save(w); err = m.Load(r)           // safetensors, PyTorch's state_dict names
//
// The package imports runtime/trainer, runtime/data and the CPU backend:
// no command line, progress bar or plotting (runtime/trainer/cli is the
// trainers'). kernels are the CUDA C of the Spec (Assemble's for CUDA): the
// package runs them on the CPU emulator. With a fatbin (CompileFatbin of
// the same kernels) the package also carries kernels.fatbin and cuda.go,
// which only a build with -tags cuda compiles: then it trains on the GPU
// through runtime/cuda (Options.Device "auto" or "cuda"), its steps
// replayed as a CUDA graph. Without the tag the package never links
// gorgonia.org/cu. PackageFilesCPU renders the CPU target's package.
func PackageFiles(pkg string, spec *trainer.Spec, kernels, fatbin []byte) (map[string][]byte, error) {
	where := "on the CPU (the CUDA C kernels through cnnc's emulator)"
	if fatbin != nil {
		where = "on an NVIDIA GPU when built with -tags cuda, else on the CPU (the CUDA C kernels through cnnc's emulator)"
	}
	files, err := packageFiles(pkg, spec, where, cpuPkg, "kernels.cu")
	if err != nil {
		return nil, err
	}
	files["kernels.cu"] = kernels
	if err := addBuiltinKernels(files, pkg, spec, kernels); err != nil {
		return nil, err
	}
	if fatbin != nil {
		if files["cuda.go"], err = cudaFile(pkg, spec); err != nil {
			return nil, err
		}
		files["kernels.fatbin"] = fatbin
	}
	return files, nil
}

// PackageFilesCPU renders the package of PackageFiles for the CPU target:
// kernels are codegen/cpu's C++ of the Spec (Assemble's for cpu.Target),
// which go build compiles into the program (cgo; addNativeKernels, as a
// CPU trainer module carries them) and runtime/native runs vectorised on
// every core, with no compiler at run time.
func PackageFilesCPU(pkg string, spec *trainer.Spec, kernels []byte) (map[string][]byte, error) {
	files, err := packageFiles(pkg, spec, "on the CPU (kernels generated for the CPU, compiled into the program)", nativePkg, nativeSource)
	if err != nil {
		return nil, err
	}
	if err := addNativeKernels(files, pkg, spec, kernels); err != nil {
		return nil, err
	}
	return files, nil
}

// packageFiles renders a package's spec.go and model.go: New over the
// "cpu" backend of backendPkg (runtime/cpu or runtime/native: New(source,
// name, Options{})) with the kernel source embedded from srcFile, which
// the caller adds with the kernels; where says in the package comment what
// the package trains on.
func packageFiles(pkg string, spec *trainer.Spec, where, backendPkg, srcFile string) (map[string][]byte, error) {
	if !token.IsIdentifier(pkg) || token.IsKeyword(pkg) || pkg == "_" {
		return nil, fmt.Errorf("trainergen: %q is not a Go package name", pkg)
	}
	specSrc, err := SpecFile(pkg, spec)
	if err != nil {
		return nil, err
	}
	f := jen.NewFile(pkg)
	f.HeaderComment(header(spec.Source))
	f.PackageComment(fmt.Sprintf("Package %s trains model %s (compiled by cnnc from %s for batches of up to %d %dx%dx%d images, %d classes) %s.", pkg, gentext.Comment(spec.Model), gentext.Comment(spec.Source), spec.Batch, spec.H, spec.W, spec.C, spec.Classes, where))
	f.PackageComment("")
	f.PackageComment("New returns a Model: Train it on a Dataset, Step it batch by batch, Evaluate, Predict, Save and Load it;")
	f.PackageComment("its methods are runtime/trainer's (github.com/cnnc/cnnc/runtime/trainer).")
	f.PackageComment("")
	f.PackageComment("Predict(pixels, k) takes images of Height*Width*Channels uint8 pixels (HWC, one after the other;")
	f.PackageComment("data.LoadImage decodes and resizes a file as training did) and returns each image's k most probable")
	f.PackageComment("classes with their probabilities, named (Prediction.Name) by the classes of the data it was trained on")
	f.PackageComment("or of the checkpoint it loaded (Classes).")
	f.ImportName(trainerPkg, "trainer")
	f.ImportName(backendPkg, path.Base(backendPkg))
	f.ImportName(devicePkg, "device")
	f.ImportName(dataPkg, "data")
	embedFile(f, "kernels", srcFile)
	f.Comment("Shapes the model was compiled for.")
	f.Const().Defs(
		jen.Id("BatchSize").Op("=").Lit(spec.Batch).Comment("samples per step at most; a smaller last batch is padded"),
		jen.Id("Height").Op("=").Lit(spec.H),
		jen.Id("Width").Op("=").Lit(spec.W),
		jen.Id("Channels").Op("=").Lit(spec.C).Comment("1: grayscale, 3: RGB; pixels are uint8 HWC"),
		jen.Id("Classes").Op("=").Lit(spec.Classes),
	)
	typeAliases(f, spec)
	if backendPkg == cpuPkg {
		f.Comment("backends open the devices the package trains on; cuda.go adds \"cuda\" in builds with -tags cuda.")
	} else {
		f.Comment("backends open the devices the package trains on.")
	}
	f.Var().Id("backends").Op("=").Qual(trainerPkg, "Backends").Values(jen.Dict{
		jen.Lit("cpu"): jen.Func().Params(jen.Op("*").Qual(trainerPkg, "Spec")).Params(jen.Qual(devicePkg, "Device"), jen.Error()).Block(
			jen.Return(jen.Qual(backendPkg, "New").Call(jen.Id("kernels"), jen.Lit(srcFile), jen.Qual(backendPkg, "Options").Values())),
		),
	})
	f.Comment("New opens the device (Options.Device), allocates the model's arena once and initialises")
	f.Comment("its parameters from Options.Seed. Close the model to free them.")
	f.Func().Id("New").Params(jen.Id("o").Id("Options")).Params(jen.Op("*").Id("Model"), jen.Error()).Block(
		jen.Return(jen.Qual(trainerPkg, "NewModel").Call(jen.Id("Spec"), jen.Id("backends"), jen.Id("o"))),
	)
	model, err := render(f)
	if err != nil {
		return nil, err
	}
	return map[string][]byte{"spec.go": specSrc, "model.go": model}, nil
}

// cudaFile renders a package's cuda.go: built only with -tags cuda, it
// adds the "cuda" backend over the embedded fatbin.
func cudaFile(pkg string, spec *trainer.Spec) ([]byte, error) {
	c := jen.NewFile(pkg)
	c.HeaderComment(header(spec.Source))
	c.HeaderComment("//go:build cuda")
	c.ImportName(trainerPkg, "trainer")
	c.ImportName(cudaPkg, "cuda")
	c.ImportName(devicePkg, "device")
	embedFile(c, "fatbin", "kernels.fatbin")
	c.Comment("With -tags cuda the package trains on the GPU. The program then links the CUDA driver")
	c.Comment("(gorgonia.org/cu), whose initialisation exits the process on a machine without an NVIDIA GPU.")
	c.Func().Id("init").Params().Block(
		jen.Id("backends").Index(jen.Lit("cuda")).Op("=").Func().Params(jen.Op("*").Qual(trainerPkg, "Spec")).Params(jen.Qual(devicePkg, "Device"), jen.Error()).Block(
			jen.Return(jen.Qual(cudaPkg, "New").Call(jen.Id("fatbin"))),
		),
	)
	return render(c)
}

// typeAliases declares the package's names for runtime/trainer's and
// runtime/data's types, each with its doc comment.
func typeAliases(f *jen.File, spec *trainer.Spec) {
	aliases := []struct{ doc, name, pkg, target string }{
		{"Model is " + gentext.Comment(spec.Model) + " on a device, its parameters and optimizer state in one planned arena.", "Model", trainerPkg, "Model"},
		{"Options configure New: seed, learning rate, device, and Train's epochs, batch, step limit and metric callbacks.", "Options", trainerPkg, "Options"},
		{"Batch is one step's input: Valid images of Height*Width*Channels uint8 pixels (HWC) and their labels.", "Batch", trainerPkg, "Batch"},
		{"Dataset is what Train and Evaluate read (data.LoadMNIST, data.OpenImageFolder, or your own).", "Dataset", dataPkg, "Dataset"},
		{"StepMetrics are one training step's results, passed to Options.OnStep.", "StepMetrics", trainerPkg, "StepMetrics"},
		{"EpochMetrics are one epoch's results, passed to Options.OnEpoch.", "EpochMetrics", trainerPkg, "EpochMetrics"},
		{"Evaluation is Evaluate's mean loss and accuracy.", "Evaluation", trainerPkg, "Evaluation"},
		{"Prediction is a class, its probability and its name when the model knows it (Predict).", "Prediction", trainerPkg, "Prediction"},
	}
	for _, a := range aliases {
		f.Comment(a.doc)
		f.Type().Id(a.name).Op("=").Qual(a.pkg, a.target)
	}
}

// PackageFileNames are the names of every file PackageFiles and
// PackageFilesCPU may write, of any target: what `cnnc gen` removes from
// a package directory where an earlier run for another target left them
// (and they say cnnc generated them), since go build would compile both
// kernel libraries.
func PackageFileNames() []string {
	return []string{"spec.go", "model.go", "kernels_cpu.go",
		"kernels.cu", "kernels_cpu.cc", "cuda_emu.h", "cuda.go", "kernels.fatbin", // emu, cuda
		nativeSource, "kernels_cpu_sse2.cc", "kernels_cpu_avx2.cc", "kernels_cpu_table.cc", "cnnc_cpu.h"} // cpu
}
