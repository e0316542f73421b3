// Package early answers a CUDA trainer's --help and --version before the
// CUDA driver starts, so that they work on a machine without a GPU.
//
// In:  the help and version texts (baked in by cnnc when it generates the
// trainer, from cli.HelpText and cli.VersionText), the flags that take a
// value, os.Args.
// Out: the text on stdout and exit 0, or nothing.
//
// Why: gorgonia.org/cu's package init calls cuInit and exits the process
// when it fails, before main runs; runtime/cuda/preflight's init, just
// before it, exits too, with a better message. Go initialises packages in
// import-path order among those whose imports are initialised. The
// trainer's generated package "cnnc.local/trainer/NAME/help" calls Handle
// from its init; it imports only this package, which imports only os, a
// package cu and preflight import too: so it is ready no later than they
// are, and its path sorts before theirs ("cnnc.local" < "github.com" <
// "gorgonia.org"), so its init runs first. That is why this package must
// keep importing nothing but os.
package early

import "os"

// ProgramPlaceholder stands for the program's name in the help text.
const ProgramPlaceholder = "\x00PROGRAM\x00"

// Handle prints help (with ProgramPlaceholder replaced by the program's
// name) or version to stdout and exits 0 when os.Args ask for one of
// them as the trainer's command line would read it; valueFlags are the
// flags that take a value (whose next word is that value).
func Handle(help, version string, valueFlags []string) {
	switch Wants(os.Args[1:], valueFlags) {
	case "help":
		os.Stdout.WriteString(replaceAll(help, ProgramPlaceholder, base(os.Args[0])))
		os.Exit(0)
	case "version":
		os.Stdout.WriteString(version)
		os.Exit(0)
	}
}

// Wants returns "help" or "version" when args ask for them (-h, --help,
// -v, --version, before "--" and outside flag values), else "".
func Wants(args []string, valueFlags []string) string {
	for i := 0; i < len(args); i++ {
		a := args[i]
		switch a {
		case "--":
			return ""
		case "-h", "--help":
			return "help"
		case "-v", "--version":
			return "version"
		}
		if len(a) > 2 && a[:2] == "--" && takesValue(a[2:], valueFlags) {
			i++ // --flag value: skip the value
		}
	}
	return ""
}

func takesValue(name string, valueFlags []string) bool {
	for _, f := range valueFlags {
		if f == name {
			return true
		}
	}
	return false
}

// base is the last element of a slash-separated path.
func base(path string) string {
	for i := len(path) - 1; i >= 0; i-- {
		if path[i] == '/' {
			return path[i+1:]
		}
	}
	return path
}

func replaceAll(s, old, repl string) string {
	var b []byte
	for i := 0; i < len(s); {
		if len(old) > 0 && i+len(old) <= len(s) && s[i:i+len(old)] == old {
			b = append(b, repl...)
			i += len(old)
			continue
		}
		b = append(b, s[i])
		i++
	}
	return string(b)
}
