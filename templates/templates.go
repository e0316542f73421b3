// Package templates holds the CUDA C kernel templates codegen renders, one
// file per kernel family, embedded in the cnnc binary. Each template is
// specialised with compile-time shapes, strides and epilogue flags, so a
// generated kernel has no runtime shape arguments and nvcc can unroll its
// loops; see codegen for the data each template receives.
package templates

import "embed"

// FS holds every *.cu.tmpl file.
//
//go:embed *.cu.tmpl
var FS embed.FS
