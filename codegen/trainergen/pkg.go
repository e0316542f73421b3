package trainergen

import (
	"fmt"
	"go/token"

	"github.com/dave/jennifer/jen"

	"github.com/cnnc/cnnc/internal/gentext"
	"github.com/cnnc/cnnc/runtime/trainer"
)

// PackageFiles renders a Go package for a user's project (`cnnc gen`): the
// Spec, the embedded kernels and a typed API around runtime/trainer:
//
//	m, err := pkg.New(pkg.Options{Seed: 1})
//	loss, correct, err := m.TrainStep(pkg.Batch{Pixels: px, Labels: lb, Valid: n})
//	loss, correct, err = m.Evaluate(batch)
//	err = m.Save("model.safetensors"); err = m.Load("model.safetensors")
//
// It runs on the CPU emulator. With a fatbin (CompileFatbin of the same
// kernels) the package also carries kernels.fatbin and cuda.go, which
// only a build with -tags cuda compiles: then it trains on the GPU through
// runtime/cuda (Options.Device "auto" or "cuda"), its steps replayed as a
// CUDA graph. Without the tag the package never links gorgonia.org/cu.
func PackageFiles(pkg string, spec *trainer.Spec, kernels, fatbin []byte) (map[string][]byte, error) {
	if !token.IsIdentifier(pkg) || token.IsKeyword(pkg) || pkg == "_" {
		return nil, fmt.Errorf("trainergen: %q is not a Go package name", pkg)
	}
	specSrc, err := SpecFile(pkg, spec)
	if err != nil {
		return nil, err
	}
	f := jen.NewFile(pkg)
	f.HeaderComment(header(spec.Source))
	where := "on the CPU (the CUDA C kernels through cnnc's emulator)"
	if fatbin != nil {
		where = "on an NVIDIA GPU when built with -tags cuda, else on the CPU (the CUDA C kernels through cnnc's emulator)"
	}
	f.PackageComment(fmt.Sprintf("Package %s trains model %s (compiled by cnnc from %s for batches of up to %d %dx%dx%d images, %d classes) %s.", pkg, gentext.Comment(spec.Model), gentext.Comment(spec.Source), spec.Batch, spec.H, spec.W, spec.C, spec.Classes, where))
	f.ImportName(trainerPkg, "trainer")
	f.ImportName(cpuPkg, "cpu")
	f.ImportName(devicePkg, "device")
	embedFile(f, "kernels", "kernels.cu")
	f.Comment("Shapes the model was compiled for.")
	f.Const().Defs(
		jen.Id("BatchSize").Op("=").Lit(spec.Batch).Comment("samples per step at most; a smaller last batch is padded"),
		jen.Id("Height").Op("=").Lit(spec.H),
		jen.Id("Width").Op("=").Lit(spec.W),
		jen.Id("Channels").Op("=").Lit(spec.C).Comment("1: grayscale, 3: RGB; pixels are uint8 HWC"),
		jen.Id("Classes").Op("=").Lit(spec.Classes),
	)
	f.Comment("Batch is one step's input: Valid images of Height*Width*Channels uint8 pixels (HWC) and their labels.")
	f.Type().Id("Batch").Op("=").Qual(trainerPkg, "Batch")
	f.Comment("Options configure New.")
	f.Type().Id("Options").Struct(
		jen.Id("Seed").Uint64().Comment("initialisation (PyTorch's default distributions) and dropout"),
		jen.Id("LR").Float32().Comment("learning rate; 0 keeps the model's"),
		jen.Id("Device").String().Comment(`"auto" or "": the GPU when the package has CUDA kernels (cnnc gen --cuda) and the program is built with -tags cuda, else the CPU; "cpu"; "cuda"`),
	)
	f.Comment("openCUDA opens the GPU with the package's fatbin; cuda.go sets it in builds with -tags cuda.")
	f.Var().Id("openCUDA").Func().Params().Params(jen.Qual(devicePkg, "Device"), jen.Error())
	f.Line()
	openCPU := jen.Return(jen.Qual(cpuPkg, "New").Call(jen.Id("kernels"), jen.Lit("kernels.cu"), jen.Qual(cpuPkg, "Options").Values()))
	noCUDA := "generated without CUDA kernels: run cnnc gen --cuda"
	if fatbin != nil {
		noCUDA = "built without -tags cuda"
	}
	f.Func().Id("openDevice").Params(jen.Id("name").String()).Params(jen.Qual(devicePkg, "Device"), jen.Error()).Block(
		jen.Switch(jen.Id("name")).Block(
			jen.Case(jen.Lit(""), jen.Lit("auto")).Block(
				jen.If(jen.Id("openCUDA").Op("!=").Nil()).Block(jen.Return(jen.Id("openCUDA").Call())),
				openCPU,
			),
			jen.Case(jen.Lit("cpu")).Block(openCPU),
			jen.Case(jen.Lit("cuda")).Block(
				jen.If(jen.Id("openCUDA").Op("==").Nil()).Block(
					jen.Return(jen.Nil(), jen.Qual("errors", "New").Call(jen.Lit(pkg+`: Options.Device "cuda": the package was `+noCUDA))),
				),
				jen.Return(jen.Id("openCUDA").Call()),
			),
		),
		jen.Return(jen.Nil(), jen.Qual("fmt", "Errorf").Call(jen.Lit(pkg+": Options.Device %q: want auto, cpu or cuda"), jen.Id("name"))),
	)
	f.Comment("Model is the model with its parameters and optimizer state in one planned arena.")
	f.Type().Id("Model").Struct(jen.Id("sess").Op("*").Qual(trainerPkg, "Session"))
	f.Comment("New opens the device, allocates the model's arena and initialises its parameters.")
	f.Func().Id("New").Params(jen.Id("o").Id("Options")).Params(jen.Op("*").Id("Model"), jen.Error()).Block(
		jen.List(jen.Id("dev"), jen.Err()).Op(":=").Id("openDevice").Call(jen.Id("o").Dot("Device")),
		jen.If(jen.Err().Op("!=").Nil()).Block(jen.Return(jen.Nil(), jen.Err())),
		jen.List(jen.Id("s"), jen.Err()).Op(":=").Qual(trainerPkg, "NewSession").Call(jen.Id("Spec"), jen.Id("dev"), jen.Id("o").Dot("Seed")),
		jen.If(jen.Err().Op("!=").Nil()).Block(jen.Id("dev").Dot("Close").Call(), jen.Return(jen.Nil(), jen.Err())),
		jen.If(jen.Id("o").Dot("LR").Op(">").Lit(0)).Block(jen.Id("s").Dot("LR").Op("=").Id("o").Dot("LR")),
		jen.Comment("on a GPU, the training step is replayed as one CUDA graph from the second step"),
		jen.Id("s").Dot("UseGraphs").Op("=").True(),
		jen.Return(jen.Op("&").Id("Model").Values(jen.Dict{jen.Id("sess"): jen.Id("s")}), jen.Nil()),
	)
	method := func(doc, name string, params []jen.Code, results []jen.Code, body ...jen.Code) {
		f.Comment(doc)
		f.Func().Params(jen.Id("m").Op("*").Id("Model")).Id(name).Params(params...).Params(results...).Block(body...)
	}
	method("TrainStep runs forward, backward and the update on b and returns its mean loss and correct predictions.",
		"TrainStep", []jen.Code{jen.Id("b").Id("Batch")}, []jen.Code{jen.Float32(), jen.Int(), jen.Error()},
		jen.Return(jen.Id("m").Dot("sess").Dot("TrainStep").Call(jen.Id("b"))))
	method("Evaluate runs the forward pass (dropout off) on b.",
		"Evaluate", []jen.Code{jen.Id("b").Id("Batch")}, []jen.Code{jen.Float32(), jen.Int(), jen.Error()},
		jen.Return(jen.Id("m").Dot("sess").Dot("EvalBatch").Call(jen.Id("b"))))
	method("Save writes a safetensors checkpoint (PyTorch's state_dict names) atomically.",
		"Save", []jen.Code{jen.Id("path").String()}, []jen.Code{jen.Error()},
		jen.Return(jen.Id("m").Dot("sess").Dot("Save").Call(jen.Id("path"), jen.Nil())))
	method("Load restores parameters, optimizer state and step from a checkpoint Save wrote.",
		"Load", []jen.Code{jen.Id("path").String()}, []jen.Code{jen.Error()},
		jen.List(jen.Id("_"), jen.Err()).Op(":=").Id("m").Dot("sess").Dot("Load").Call(jen.Id("path"), jen.True()),
		jen.Return(jen.Err()))
	method("Steps is the number of training steps taken.", "Steps", nil, []jen.Code{jen.Int64()},
		jen.Return(jen.Id("m").Dot("sess").Dot("Step")))
	method("Device names the device the model trains on.", "Device", nil, []jen.Code{jen.String()},
		jen.Return(jen.Id("m").Dot("sess").Dot("Dev").Dot("Name").Call()))
	method("Close frees the model's memory.", "Close", nil, []jen.Code{jen.Error()},
		jen.Id("err").Op(":=").Id("m").Dot("sess").Dot("Close").Call(),
		jen.If(jen.Id("cerr").Op(":=").Id("m").Dot("sess").Dot("Dev").Dot("Close").Call(), jen.Err().Op("==").Nil()).Block(jen.Id("err").Op("=").Id("cerr")),
		jen.Return(jen.Err()))
	model, err := render(f)
	if err != nil {
		return nil, err
	}
	files := map[string][]byte{"spec.go": specSrc, "model.go": model, "kernels.cu": kernels}
	if err := addBuiltinKernels(files, pkg, spec, kernels); err != nil {
		return nil, err
	}
	if fatbin != nil {
		c := jen.NewFile(pkg)
		c.HeaderComment(header(spec.Source))
		c.HeaderComment("//go:build cuda")
		c.ImportName(cudaPkg, "cuda")
		c.ImportName(devicePkg, "device")
		embedFile(c, "fatbin", "kernels.fatbin")
		c.Comment("With -tags cuda the package trains on the GPU. The program then links the CUDA driver")
		c.Comment("(gorgonia.org/cu), whose initialisation exits the process on a machine without an NVIDIA GPU.")
		c.Func().Id("init").Params().Block(
			jen.Id("openCUDA").Op("=").Func().Params().Params(jen.Qual(devicePkg, "Device"), jen.Error()).Block(
				jen.Return(jen.Qual(cudaPkg, "New").Call(jen.Id("fatbin"))),
			),
		)
		src, err := render(c)
		if err != nil {
			return nil, err
		}
		files["cuda.go"] = src
		files["kernels.fatbin"] = fatbin
	}
	return files, nil
}
