package trainergen

// For the external tests: what WriteModule and GoBuild write and run,
// without writing the runtime's copy or running go.
var (
	GoMod             = goMod
	AddBuiltinKernels = addBuiltinKernels
	BuildArgs         = buildArgs
)
