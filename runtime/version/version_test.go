package version

import (
	"runtime/debug"
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestFromBuildInfoOfCnncItself(t *testing.T) {
	bi := &debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Path: Module, Version: "(devel)"},
		Settings: []debug.BuildSetting{{Key: "vcs.revision", Value: "abc123"}, {Key: "vcs.modified", Value: "true"}}}
	i := fromBuildInfo(Info{}, bi)
	assert.Equal(t, Info{Version: "(devel)", Commit: "abc123+dirty", Go: "go1.26.8"}, i)
	assert.Equal(t, "cnnc (devel) (commit abc123+dirty, go1.26.8)", i.String())
}

func TestFromBuildInfoOfATrainer(t *testing.T) {
	// a trainer's main module is its own; cnnc is a dependency, and the
	// main module's VCS settings are not cnnc's
	bi := &debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Path: "cnnc.trainer/m"},
		Deps:     []*debug.Module{{Path: "gonum.org/v1/plot", Version: "v0.17.0"}, {Path: Module, Version: "v0.4.1"}},
		Settings: []debug.BuildSetting{{Key: "vcs.revision", Value: "not-cnnc"}}}
	assert.Equal(t, Info{Version: "v0.4.1", Go: "go1.26.8"}, fromBuildInfo(Info{}, bi))
	// stamped values win
	assert.Equal(t, Info{Version: "v0.5.0", Commit: "def", Go: "go1.26.8"}, fromBuildInfo(Info{Version: "v0.5.0", Commit: "def"}, bi))
}

func TestLDFlagsNameTheVariables(t *testing.T) {
	assert.Contains(t, LDFlags(), "-X github.com/cnnc/cnnc/runtime/version.stampedVersion=")
}
