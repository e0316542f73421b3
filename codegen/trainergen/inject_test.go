package trainergen_test

import (
	"bytes"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"github.com/cnnc/cnnc/compiler/plan"
	"github.com/cnnc/cnnc/driver"
	"go/parser"
	"go/scanner"
	"go/token"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cnnc/cnnc/codegen"
	cpugen "github.com/cnnc/cnnc/codegen/cpu"
	"github.com/cnnc/cnnc/codegen/trainergen"
	"github.com/cnnc/cnnc/compiler"
	"github.com/cnnc/cnnc/internal/gentext"
	"github.com/cnnc/cnnc/runtime/cpu"
	"github.com/cnnc/cnnc/runtime/emu"
	"github.com/cnnc/cnnc/runtime/native"
	"github.com/cnnc/cnnc/runtime/trainer"
)

// Strings a user chooses reach generated files: the model file's name (as
// typed), the model's and layers' names, data paths. These tests render
// every generated file — the kernels (.cu), a trainer module (main.go,
// spec.go, go.mod, kernels_cpu.cc/.go), the CUDA main, a `cnnc gen`
// package with cuda.go, and the CPU target's kernels, trainer main and
// `cnnc gen` package (its translation units and kernel table) — from hostile strings and check that each file
// parses and holds exactly what it holds for plain placeholders, each
// placeholder replaced by the hostile string in the form its place needs:
// as it is inside Go string literals, through gentext.Comment in comments.

// userStrings are the strings under test.
type userStrings struct{ source, model, layer, path string }

// placeholders are plain stand-ins: rendered from them, every file is as
// cnnc means to write it. They are distinct and none contains another.
var placeholders = userStrings{source: "SRCPH.cnn", model: "ModelPH", layer: "layerq", path: "DATAPH"}

// hostile are the table's inputs: line breaks of every kind (g++ and nvcc
// take a lone CR as one, Go does not), comment terminators, trigraphs,
// line splices, quotes, NUL and other control bytes, invalid UTF-8, a
// byte order mark, code that would run if it escaped its comment.
var hostile = []string{
	"m\r__attribute__((constructor)) static void pwn() { abort(); }\r//.cnn",
	"m\nfunc init() { panic(1) }\n//.cnn",
	"m*/ func init() { panic(1) } /*.cnn",
	"m\r\n#error injected\r\n.cnn",
	"m\u2028x\u2029y.cnn",
	"m??/\nint injected;",
	"m\\\nint injected;",
	"m\\",
	"m\x00.cnn",
	"m\xff\xfe.cnn",
	"\ufeffm.cnn",
	`m".cnn`,
	"`m`.cnn",
	"``m''.cnn",
	"",
	" m.cnn ",
	"m\t.cnn",
	"m\x1b[31mred.cnn",
	"mod\"ule evil\nreplace x => ../..",
	"Con",
	"ünïcødé/模型.cnn",
}

// tinyModel is small (a few launches, a short spec) so that the fuzzer
// renders many files a second; it has a data block, like a real model.
const tinyModel = `model Tiny(image: f32[1,28,28], label: class[10]) {
    fc   = linear(flatten(image), out=10)
    loss = cross_entropy(fc, label)
}
train {
    optimizer = sgd(lr=0.1)
    batch = 2
}
data {
    train = mnist("d")
    test  = mnist("d")
}
`

// compiled is tinyModel compiled once, and the files rendered from the
// placeholders.
var compiled struct {
	once  sync.Once
	res   *compiler.Result
	c     *trainergen.Compiled
	plain map[string][]byte
	err   error
}

func tinyCompiled(t testing.TB) (*compiler.Result, *trainergen.Compiled) {
	compiled.once.Do(func() {
		if compiled.res, compiled.err = compiler.CompileSource(placeholders.source, []byte(tinyModel), compiler.Options{}); compiled.err != nil {
			return
		}
		compiled.c, compiled.err = driver.Compile(compiled.res, plan.Config{}, driver.CUDA)
	})
	require.NoError(t, compiled.err)
	return compiled.res, compiled.c
}

// renderPlain is renderAll(placeholders), rendered once; a copy.
func renderPlain(t testing.TB) map[string][]byte {
	tinyCompiled(t)
	if compiled.plain == nil {
		compiled.plain = renderAll(t, placeholders)
	}
	out := map[string][]byte{}
	for name, b := range compiled.plain {
		out[name] = b
	}
	return out
}

// renderAll renders every generated file for u, keyed by a path that says
// which output it belongs to.
func renderAll(t testing.TB, u userStrings) map[string][]byte {
	res, c := tinyCompiled(t)
	// the kernels' header names the model file and the model
	prog, err := codegen.GenerateNodes(u.model, res.Graph.Nodes, codegen.Options{Batch: 2, SourceName: u.source})
	require.NoError(t, err)
	kernels := prog.Source

	spec := *c.Spec
	spec.Source, spec.Model = u.source, u.model
	spec.TrainData = trainer.DataSource{Kind: "mnist", Path: u.path}
	spec.TestData = trainer.DataSource{Kind: "imagefolder", Path: u.path + "/test"}
	spec.Params = append([]trainer.Tensor(nil), spec.Params...)
	spec.Params[0].Name = u.layer + ".weight"
	spec.PlanSummary = "memory plan: recomputed: " + u.layer + "\n"

	files := map[string][]byte{"kernels.cu": kernels}
	add := func(name string, b []byte, err error) {
		t.Helper()
		require.NoError(t, err, name)
		files[name] = b
	}
	b, err := trainergen.SpecFile("main", &spec)
	add("trainer/spec.go", b, err)
	b, err = trainergen.MainFile(&spec)
	add("trainer/main.go", b, err)
	add("trainer/go.mod", trainergen.GoMod(&spec), nil)
	builtin := map[string][]byte{}
	require.NoError(t, trainergen.AddBuiltinKernels(builtin, "main", &spec, kernels))
	for name, b := range builtin {
		add("trainer/"+name, b, nil)
	}
	// cuda_emu.h is cnnc's own text: checked once here, not compared below
	require.Equal(t, "// Code generated by cnnc (a copy of its runtime/emu/cuda_emu.h); DO NOT EDIT.\n"+emu.Header(), string(files["trainer/cuda_emu.h"]))
	delete(files, "trainer/cuda_emu.h")
	b, err = trainergen.MainFileCUDA(&spec)
	add("cuda/main.go", b, err)
	pkg, err := trainergen.PackageFiles("mnistnet", &spec, kernels, []byte("not a fatbin"))
	require.NoError(t, err)
	for name, b := range pkg {
		if name != "kernels.fatbin" && name != "cuda_emu.h" {
			add("pkg/"+name, b, nil)
		}
	}
	// the CPU target's kernels, trainer main and `cnnc gen` package
	cpuProg, err := cpugen.GenerateNodes(u.model, res.Graph.Nodes, codegen.Options{Batch: 2, SourceName: u.source})
	require.NoError(t, err)
	files["kernels_cpu.h"] = cpuProg.Source
	b, err = trainergen.MainFileCPU(&spec)
	add("cputrainer/main.go", b, err)
	cpuPkg, err := trainergen.PackageFilesCPU("mnistnet", &spec, cpuProg.Source)
	require.NoError(t, err)
	// cnnc_cpu.h is cnnc's own text: checked once here, not compared below
	require.Equal(t, "// Code generated by cnnc (a copy of its runtime/native/cnnc_cpu.h); DO NOT EDIT.\n"+native.Header(), string(cpuPkg["cnnc_cpu.h"]))
	for name, b := range cpuPkg {
		if name != "cnnc_cpu.h" {
			add("cpupkg/"+name, b, nil)
		}
	}
	return files
}

// checkGenerated renders every file from h and from the placeholders and
// compares them as described above.
func checkGenerated(t testing.TB, h userStrings) {
	for _, s := range []string{h.source, h.model, strings.ToLower(h.model), h.layer, h.path} {
		checkCommentForm(t, s)
	}
	want, got := renderPlain(t), renderAll(t, h)
	sameBuiltinIDs(t, want, got)
	if h.source == "" || h.model == "" || h.layer == "" || h.path == "" {
		// the spec's literal leaves empty strings out: no token-by-token
		// comparison, only that every file is well formed
		for name, g := range got {
			checkBytes(t, name, g)
			if strings.HasSuffix(name, ".go") {
				_, err := parser.ParseFile(token.NewFileSet(), name, g, parser.ParseComments|parser.AllErrors)
				require.NoError(t, err, "%s does not parse", name)
			}
		}
		return
	}
	inStrings := strings.NewReplacer(placeholders.source, h.source, placeholders.model, h.model,
		placeholders.layer, h.layer, placeholders.path, h.path)
	inComments := strings.NewReplacer(placeholders.source, gentext.Comment(h.source),
		placeholders.model, gentext.Comment(h.model), strings.ToLower(placeholders.model), gentext.Comment(strings.ToLower(h.model)),
		placeholders.layer, gentext.Comment(h.layer), placeholders.path, gentext.Comment(h.path))
	names := make([]string, 0, len(want))
	for name := range want {
		names = append(names, name)
	}
	sort.Strings(names)
	require.Len(t, got, len(want))
	for _, name := range names {
		g := got[name]
		checkBytes(t, name, g)
		if strings.HasSuffix(name, ".go") {
			checkGoFile(t, name, g, want[name], inStrings, inComments)
			continue
		}
		// .cu, .cc, .h, go.mod: not reformatted by anyone, so exactly the
		// placeholders' text with the comment forms put in
		require.Equal(t, inComments.Replace(string(want[name])), string(g), name)
	}
}

// sameBuiltinIDs: the built-in kernels are named by their source's hash,
// which holds the model file's name. It puts got's names into want, after
// checking that got's library is keyed by got's source.
func sameBuiltinIDs(t testing.TB, want, got map[string][]byte) {
	ids := builtinIDs(t, want["trainer/kernels_cpu.cc"], got["trainer/kernels_cpu.cc"])
	require.Equal(t, fmt.Sprintf("%x", sha256.Sum256(got["kernels.cu"])), ids[3], "the library is keyed by its source")
	cpuIDs := cpuBuiltinIDs(t, want["cpupkg/kernels_cpu_table.cc"], got["cpupkg/kernels_cpu_table.cc"])
	cpuID := sha256.Sum256([]byte(native.Header() + "\x00" + string(got["kernels_cpu.h"])))
	require.Equal(t, fmt.Sprintf("%x", cpuID[:8]), cpuIDs[1], "the CPU library is named by its source")
	require.Equal(t, fmt.Sprintf("%x", sha256.Sum256(got["kernels_cpu.h"])), cpuIDs[3], "the CPU library is keyed by its source")
	byHash := strings.NewReplacer(append(ids, cpuIDs...)...)
	for name, b := range want {
		want[name] = []byte(byHash.Replace(string(b)))
	}
}

// cpuBuiltinIDs returns replacer pairs from the ids in want's CPU-target
// kernel table to got's: the library id and the source's SHA-256.
func cpuBuiltinIDs(t testing.TB, want, got []byte) []string {
	return idPairs(t, want, got, regexp.MustCompile(`cnnc_cpu_builtin_([0-9a-f]{16})`),
		regexp.MustCompile(`\{CNNC_CPU_ABI, "([0-9a-f]{64})"`))
}

// builtinIDs returns replacer pairs from the ids in want's built-in kernel
// translation unit to got's: the module id and the source's SHA-256.
func builtinIDs(t testing.TB, want, got []byte) []string {
	return idPairs(t, want, got, regexp.MustCompile(`cnnc_emu_builtin_([0-9a-f]{16})`),
		regexp.MustCompile(`"cnnc_emu_source_sha256", const_cast<char\*>\("([0-9a-f]{64})"`))
}

// idPairs returns, for each pattern, the pair of its first submatch in
// want and in got.
func idPairs(t testing.TB, want, got []byte, patterns ...*regexp.Regexp) []string {
	var pairs []string
	for _, re := range patterns {
		w, g := re.FindSubmatch(want), re.FindSubmatch(got)
		require.NotNil(t, w, re.String())
		require.NotNil(t, g, re.String())
		pairs = append(pairs, string(w[1]), string(g[1]))
	}
	return pairs
}

// checkBytes: nothing in a generated file that a compiler or editor reads
// as a line break or refuses (CR, NUL, U+2028/9, a BOM, invalid UTF-8).
func checkBytes(t testing.TB, name string, b []byte) {
	require.True(t, utf8.Valid(b), "%s: invalid UTF-8", name)
	for _, bad := range []string{"\r", "\x00", "\u2028", "\u2029", "\ufeff"} {
		require.NotContains(t, string(b), bad, "%s holds %q", name, bad)
	}
}

// checkCommentForm: what gentext.Comment makes of s stays inside a comment
// line in Go, C/C++/CUDA and go.mod and is not rewritten by gofmt
// (printable ASCII; no "*/", no "??", no two backquotes or two single
// quotes in a row; no backslash at its end) and gives s back.
func checkCommentForm(t testing.TB, s string) {
	c := gentext.Comment(s)
	for i := 0; i < len(c); i++ {
		require.True(t, c[i] >= 0x20 && c[i] <= 0x7e, "Comment(%q) = %q", s, c)
	}
	for _, seq := range []string{"*/", "??", "``", "''"} {
		require.NotContains(t, c, seq, "Comment(%q) = %q", s, c)
	}
	require.False(t, strings.HasSuffix(c, `\`), "Comment(%q) = %q", s, c)
	if c != s {
		back, err := strconv.Unquote(c)
		require.NoError(t, err, "Comment(%q) = %q", s, c)
		require.Equal(t, s, back)
	}
}

// checkGoFile parses a generated Go file and compares its tokens with the
// placeholders' file: strings unquoted, with the placeholders replaced by
// the hostile strings; comments with their comment forms.
func checkGoFile(t testing.TB, name string, got, want []byte, inStrings, inComments *strings.Replacer) {
	fset := token.NewFileSet()
	_, err := parser.ParseFile(fset, name, got, parser.ParseComments|parser.AllErrors)
	require.NoError(t, err, "%s does not parse:\n%s", name, got)
	gt, wt := goTokens(t, got), goTokens(t, want)
	require.Equal(t, len(wt), len(gt), "%s: token count", name)
	for i := range wt {
		require.Equal(t, wt[i].tok, gt[i].tok, "%s: token %d", name, i)
		switch wt[i].tok {
		case token.STRING:
			ws, err := strconv.Unquote(wt[i].lit)
			require.NoError(t, err)
			gs, err := strconv.Unquote(gt[i].lit)
			require.NoError(t, err)
			require.Equal(t, inStrings.Replace(ws), gs, "%s: string %s", name, wt[i].lit)
		case token.COMMENT:
			require.Equal(t, inComments.Replace(wt[i].lit), gt[i].lit, "%s: comment", name)
		default:
			require.Equal(t, wt[i].lit, gt[i].lit, "%s: token %d", name, i)
		}
	}
}

type goToken struct {
	tok token.Token
	lit string
}

func goTokens(t testing.TB, src []byte) []goToken {
	fset := token.NewFileSet()
	f := fset.AddFile("", fset.Base(), len(src))
	var s scanner.Scanner
	var errs []string
	s.Init(f, src, func(pos token.Position, msg string) { errs = append(errs, msg) }, scanner.ScanComments)
	var out []goToken
	for {
		_, tok, lit := s.Scan()
		if tok == token.EOF {
			break
		}
		if tok == token.SEMICOLON && lit == "\n" {
			continue // automatic, where lines end
		}
		out = append(out, goToken{tok, lit})
	}
	require.Empty(t, errs)
	return out
}

func TestHostileStringsStayInTheirPlace(t *testing.T) {
	for _, h := range hostile {
		t.Run(strconv.Quote(h), func(t *testing.T) {
			checkGenerated(t, userStrings{source: h, model: h, layer: h, path: h})
		})
	}
}

func FuzzGeneratedSources(f *testing.F) {
	for _, h := range hostile {
		f.Add(h, "M", "conv1", "data/"+h)
		f.Add("m.cnn", h, h, h)
	}
	f.Fuzz(func(t *testing.T, source, model, layer, path string) {
		checkGenerated(t, userStrings{source, model, layer, path})
	})
}

// What real tools make of the files: the C++ preprocessor (with trigraphs
// on, as older nvcc host compilers have them) sees the same program in the
// hostile kernels as in the plain ones, and go reads the same go.mod.
func TestHostileStringsThroughTheTools(t *testing.T) {
	cxx, err := exec.LookPath("g++")
	if err != nil {
		t.Skip("no g++")
	}
	preprocess := func(src []byte) string {
		t.Helper()
		cmd := exec.Command(cxx, "-x", "c++", "-std=c++20", "-trigraphs", "-fpreprocessed", "-P", "-E", "-")
		cmd.Stdin = bytes.NewReader(src)
		out, err := cmd.CombinedOutput()
		require.NoError(t, err, "%s", out)
		return string(out)
	}
	dir := t.TempDir()
	modJSON := func(mod []byte) string {
		t.Helper()
		require.NoError(t, os.WriteFile(filepath.Join(dir, "go.mod"), mod, 0o644))
		cmd := exec.Command("go", "mod", "edit", "-json")
		cmd.Dir = dir
		out, err := cmd.CombinedOutput()
		require.NoError(t, err, "%s", out)
		var m struct{ Module struct{ Path string } }
		require.NoError(t, json.Unmarshal(out, &m))
		assert.Equal(t, "cnnc.local/trainer", m.Module.Path)
		// and the path is one go accepts (a model named Con once made it refuse the module)
		cmd = exec.Command("go", "list", "-m")
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), "GOWORK=off", "GOFLAGS=-mod=mod")
		lst, err := cmd.CombinedOutput()
		require.NoError(t, err, "%s", lst)
		return string(out)
	}
	wantMod := modJSON(renderPlain(t)["trainer/go.mod"])
	for _, h := range hostile {
		plain, got := renderPlain(t), renderAll(t, userStrings{source: h, model: h, layer: h, path: h})
		sameBuiltinIDs(t, plain, got)
		names := []string{"kernels.cu", "trainer/kernels_cpu.cc", "pkg/kernels_cpu.cc", "kernels_cpu.h"}
		for name := range got {
			if strings.HasPrefix(name, "cpupkg/") && strings.HasSuffix(name, ".cc") {
				names = append(names, name) // the CPU target's translation units and kernel table
			}
		}
		for _, name := range names {
			assert.Equal(t, preprocess(plain[name]), preprocess(got[name]), "%s from %q", name, h)
		}
		assert.Equal(t, wantMod, modJSON(got["trainer/go.mod"]), "%q", h)
	}
}

// The defect as found: a model file named with CRs put C++ of its own into
// the kernels, and the CPU trainer ran it when it compiled them. Compiled
// now, the kernels hold only their comment; the name is shown quoted.
func TestModelFileNameCannotInjectKernelCode(t *testing.T) {
	marker := filepath.Join(t.TempDir(), "pwned")
	name := fmt.Sprintf("m\r__attribute__((constructor)) static void pwn() { fclose(fopen(%q, \"w\")); }\r//.cnn", marker)
	src, err := os.ReadFile("../../examples/mnist.cnn")
	require.NoError(t, err)
	res, err := compiler.CompileSource(name, src, compiler.Options{Batch: 2})
	require.NoError(t, err)
	prog, err := codegen.GenerateNodes(res.Graph.Name, res.Graph.Nodes[:1], codegen.Options{Batch: 2, SourceName: name})
	require.NoError(t, err)
	assert.True(t, strings.HasPrefix(string(prog.Source), "// Code generated by cnnc from "+strconv.QuoteToASCII(name)[:20]), "%.120q", prog.Source)
	if _, err := exec.LookPath("g++"); err != nil {
		t.Skip("no g++")
	}
	dev, err := cpu.New(prog.Source, "kernels.cu", cpu.Options{})
	require.NoError(t, err)
	dev.Close()
	assert.NoFileExists(t, marker, "code from the file name ran")

	// the CPU target's kernels, compiled by runtime/native under that name
	cpuProg, err := cpugen.GenerateNodes(res.Graph.Name, res.Graph.Nodes[:1], codegen.Options{Batch: 2, SourceName: name})
	require.NoError(t, err)
	assert.True(t, strings.HasPrefix(string(cpuProg.Source), "// Code generated by cnnc from "+strconv.QuoteToASCII(name)[:20]), "%.120q", cpuProg.Source)
	ndev, err := native.New(cpuProg.Source, name, native.Options{})
	require.NoError(t, err)
	ndev.Close()
	assert.NoFileExists(t, marker, "code from the file name ran in the CPU target's kernels")
}
