// Package cnnc carries the runtime's source inside the cnnc binary, so
// that `cnnc build` can compile a standalone trainer in any directory: the
// generated trainer module replaces github.com/cnnc/cnnc with this copy
// and needs nothing else but the Go module proxy for the runtime's own
// dependencies.
package cnnc

import "embed"

// RuntimeSource holds go.mod, go.sum and the runtime packages.
//
//go:embed go.mod go.sum runtime
var RuntimeSource embed.FS
