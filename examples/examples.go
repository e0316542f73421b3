// Package examples holds cnnc's example models, embedded so that test
// binaries carry them (the GPU bundle's run where there is no Go tree).
package examples

import "embed"

// Models are the example .cnn files, by file name ("mnist.cnn").
//
//go:embed *.cnn
var Models embed.FS
