// Command lint-tracked fails when git tracks what belongs in no
// repository: a binary — an executable (ELF, Mach-O or PE magic) or any
// file with a NUL byte — or a file over 1 MB, outside testdata folders
// (where test inputs may be binary or large on purpose). In: the files
// `git ls-files` lists in the current directory's repository. Out: one line
// per offending file and exit status 1, or nothing. `make lint` runs it:
// a 15 MB trainer binary was once committed by mistake.
package main

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// maxBytes is the largest tracked file allowed outside testdata.
const maxBytes = 1 << 20

func main() {
	files, err := tracked(".")
	if err != nil {
		fmt.Fprintf(os.Stderr, "lint-tracked: %v\n", err)
		os.Exit(2)
	}
	problems := check(".", files)
	for _, p := range problems {
		fmt.Println(p)
	}
	if len(problems) > 0 {
		fmt.Println("lint-tracked: build outputs and large files do not belong in git (.gitignore them; test inputs go in testdata/)")
		os.Exit(1)
	}
}

// tracked lists the files git tracks in the repository at dir, relative
// to dir.
func tracked(dir string) ([]string, error) {
	out, err := exec.Command("git", "-C", dir, "ls-files", "-z").Output()
	if err != nil {
		return nil, fmt.Errorf("git ls-files: %v", err)
	}
	var files []string
	for _, f := range strings.Split(string(out), "\x00") {
		if f != "" {
			files = append(files, f)
		}
	}
	return files, nil
}

// check returns a line for each of files (relative to root) that is a
// binary or over maxBytes and not under a testdata folder.
func check(root string, files []string) []string {
	var problems []string
	for _, f := range files {
		if inTestdata(f) {
			continue
		}
		if why := inspect(filepath.Join(root, f)); why != "" {
			problems = append(problems, f+": "+why)
		}
	}
	return problems
}

func inTestdata(path string) bool {
	for _, elem := range strings.Split(filepath.ToSlash(path), "/") {
		if elem == "testdata" {
			return true
		}
	}
	return false
}

// inspect says what is wrong with the file at path, or "".
func inspect(path string) string {
	fi, err := os.Lstat(path)
	if err != nil {
		if os.IsNotExist(err) {
			return "" // deleted in the work tree, not yet in the index
		}
		return err.Error()
	}
	if !fi.Mode().IsRegular() {
		return "" // a symbolic link or submodule: nothing of its own
	}
	if fi.Size() > maxBytes {
		return fmt.Sprintf("%d bytes, over the 1 MB limit", fi.Size())
	}
	f, err := os.Open(path)
	if err != nil {
		return err.Error()
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxBytes+1))
	if err != nil {
		return err.Error()
	}
	if kind := executable(b); kind != "" {
		return kind + " executable"
	}
	if i := bytes.IndexByte(b, 0); i >= 0 {
		return fmt.Sprintf("binary (a NUL byte at offset %d)", i)
	}
	return ""
}

// executable names the executable format whose magic b starts with
// ("an ELF"), or "".
func executable(b []byte) string {
	switch {
	case bytes.HasPrefix(b, []byte("\x7fELF")):
		return "an ELF"
	case len(b) >= 4:
		switch binary.BigEndian.Uint32(b) {
		case 0xfeedface, 0xfeedfacf, 0xcefaedfe, 0xcffaedfe, 0xcafebabe:
			return "a Mach-O"
		}
	}
	if len(b) >= 0x40 && bytes.HasPrefix(b, []byte("MZ")) {
		// the PE header's offset is at 0x3c
		if off := int(binary.LittleEndian.Uint32(b[0x3c:])); off >= 0 && off+4 <= len(b) && bytes.Equal(b[off:off+4], []byte("PE\x00\x00")) {
			return "a PE"
		}
	}
	return ""
}
