// Command mnistsmall writes the first N training and M test digits of MNIST
// (from the GoMNIST module) as uncompressed IDX files into a folder: small
// data for the GPU bundle's parity check.
//
//	go run ./scripts/mnistsmall DIR [N M]
package main

import (
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"strconv"

	"github.com/cnnc/cnnc/internal/datasets"
	"github.com/cnnc/cnnc/runtime/data"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: mnistsmall DIR [N M]")
		os.Exit(2)
	}
	n, m := 2048, 512
	if len(os.Args) == 4 {
		n, _ = strconv.Atoi(os.Args[2])
		m, _ = strconv.Atoi(os.Args[3])
	}
	src, err := datasets.MNISTDir()
	check(err)
	check(os.MkdirAll(os.Args[1], 0o755))
	for _, s := range []struct {
		split string
		count int
	}{{"train", n}, {"t10k", m}} {
		ds, err := data.LoadMNIST(src, s.split)
		check(err)
		im := ds.Images
		var img []byte
		img = binary.BigEndian.AppendUint32(img, 0x803)
		img = binary.BigEndian.AppendUint32(img, uint32(s.count))
		img = binary.BigEndian.AppendUint32(img, uint32(im.H))
		img = binary.BigEndian.AppendUint32(img, uint32(im.W))
		img = append(img, im.Pixels[:s.count*im.H*im.W]...)
		check(os.WriteFile(filepath.Join(os.Args[1], s.split+"-images-idx3-ubyte"), img, 0o644))
		var lb []byte
		lb = binary.BigEndian.AppendUint32(lb, 0x801)
		lb = binary.BigEndian.AppendUint32(lb, uint32(s.count))
		lb = append(lb, ds.Labels[:s.count]...)
		check(os.WriteFile(filepath.Join(os.Args[1], s.split+"-labels-idx1-ubyte"), lb, 0o644))
	}
}

func check(err error) {
	if err != nil {
		fmt.Fprintln(os.Stderr, "mnistsmall:", err)
		os.Exit(1)
	}
}
