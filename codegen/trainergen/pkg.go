package trainergen

import (
	"fmt"

	"github.com/dave/jennifer/jen"

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
// It runs on the CPU emulator; the package never links gorgonia.org/cu.
func PackageFiles(pkg string, spec *trainer.Spec, kernels []byte) (map[string][]byte, error) {
	specSrc, err := SpecFile(pkg, spec)
	if err != nil {
		return nil, err
	}
	f := jen.NewFile(pkg)
	f.HeaderComment(header(spec.Source))
	f.PackageComment(fmt.Sprintf("Package %s trains model %s (compiled by cnnc from %s for batches of up to %d %dx%dx%d images, %d classes) on the CPU.", pkg, spec.Model, spec.Source, spec.Batch, spec.H, spec.W, spec.C, spec.Classes))
	f.ImportName(trainerPkg, "trainer")
	f.ImportName(cpuPkg, "cpu")
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
	)
	f.Comment("Model is the model with its parameters and optimizer state in one planned arena.")
	f.Type().Id("Model").Struct(jen.Id("sess").Op("*").Qual(trainerPkg, "Session"))
	f.Comment("New allocates the model's arena and initialises its parameters.")
	f.Func().Id("New").Params(jen.Id("o").Id("Options")).Params(jen.Op("*").Id("Model"), jen.Error()).Block(
		jen.List(jen.Id("dev"), jen.Err()).Op(":=").Qual(cpuPkg, "New").Call(jen.Id("kernels"), jen.Lit("kernels.cu"), jen.Qual(cpuPkg, "Options").Values()),
		jen.If(jen.Err().Op("!=").Nil()).Block(jen.Return(jen.Nil(), jen.Err())),
		jen.List(jen.Id("s"), jen.Err()).Op(":=").Qual(trainerPkg, "NewSession").Call(jen.Id("Spec"), jen.Id("dev"), jen.Id("o").Dot("Seed")),
		jen.If(jen.Err().Op("!=").Nil()).Block(jen.Id("dev").Dot("Close").Call(), jen.Return(jen.Nil(), jen.Err())),
		jen.If(jen.Id("o").Dot("LR").Op(">").Lit(0)).Block(jen.Id("s").Dot("LR").Op("=").Id("o").Dot("LR")),
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
	method("Close frees the model's memory.", "Close", nil, []jen.Code{jen.Error()},
		jen.Id("err").Op(":=").Id("m").Dot("sess").Dot("Close").Call(),
		jen.If(jen.Id("cerr").Op(":=").Id("m").Dot("sess").Dot("Dev").Dot("Close").Call(), jen.Err().Op("==").Nil()).Block(jen.Id("err").Op("=").Id("cerr")),
		jen.Return(jen.Err()))
	model, err := render(f)
	if err != nil {
		return nil, err
	}
	return map[string][]byte{"spec.go": specSrc, "model.go": model, "kernels.cu": kernels}, nil
}
