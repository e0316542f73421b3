// Package version says which cnnc built a program: cnnc itself, a trainer
// it generated, or a package from `cnnc gen`. In: the Go build info of the
// running binary, and two variables a build may stamp with -ldflags -X
// (trainers are built by cnnc in a module of their own that reaches cnnc's
// source through a replace directive, so Go records no version or commit
// of cnnc there: cnnc stamps its own, see LDFlags). Out: one line for
// --version and the fields for checkpoint metadata.
package version

import (
	"fmt"
	"runtime/debug"
)

// Module is cnnc's module path.
const Module = "github.com/cnnc/cnnc"

// Stamped at build time (go build -ldflags "-X ...=..."), empty otherwise.
var (
	stampedVersion string // module version, e.g. v0.3.0
	stampedCommit  string // VCS revision, "+dirty" appended when modified
)

// Info is what is known of the cnnc that built this binary.
type Info struct {
	Version string // module version: "v1.2.3", or "(devel)" for a source tree
	Commit  string // VCS revision (hex, "+dirty" if the tree was modified), "" if unknown
	Go      string // the Go release that built the binary
}

// Get reads the stamped values first, then the build info: the main
// module's when the binary is cnnc itself, else the cnnc dependency's.
func Get() Info {
	info := Info{Version: stampedVersion, Commit: stampedCommit}
	if bi, ok := debug.ReadBuildInfo(); ok {
		info = fromBuildInfo(info, bi)
	}
	if info.Version == "" {
		info.Version = "(devel)"
	}
	return info
}

func fromBuildInfo(info Info, bi *debug.BuildInfo) Info {
	info.Go = bi.GoVersion
	mod := &bi.Main
	if mod.Path != Module {
		mod = nil
		for _, d := range bi.Deps {
			if d.Path == Module {
				mod = d
			}
		}
	}
	if mod == nil {
		return info
	}
	if info.Version == "" && mod.Version != "" {
		info.Version = mod.Version
	}
	if info.Commit == "" && mod == &bi.Main {
		var rev, modified string
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				rev = s.Value
			case "vcs.modified":
				modified = s.Value
			}
		}
		if rev != "" && modified == "true" {
			rev += "+dirty"
		}
		info.Commit = rev
	}
	return info
}

// String is the line --version prints, e.g.
// "cnnc v0.3.0 (commit 0123abcd..., go1.26.8)".
func (i Info) String() string {
	s := "cnnc " + i.Version
	switch {
	case i.Commit != "" && i.Go != "":
		s += fmt.Sprintf(" (commit %s, %s)", i.Commit, i.Go)
	case i.Commit != "":
		s += fmt.Sprintf(" (commit %s)", i.Commit)
	case i.Go != "":
		s += fmt.Sprintf(" (%s)", i.Go)
	}
	return s
}

// LDFlags are the -ldflags that stamp this binary's own cnnc version and
// commit into another binary built from the same source (a trainer cnnc
// builds), so that it reports the cnnc that generated it.
func LDFlags() string {
	i := Get()
	s := fmt.Sprintf("-X %s/runtime/version.stampedVersion=%s", Module, i.Version)
	if i.Commit != "" {
		s += fmt.Sprintf(" -X %s/runtime/version.stampedCommit=%s", Module, i.Commit)
	}
	return s
}
