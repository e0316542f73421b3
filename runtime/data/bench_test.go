package data

import (
	"context"
	"fmt"
	"image"
	"math/rand/v2"
	"path/filepath"
	"testing"
	"time"
)

// benchFolder writes n photo-sized images (256x256 colour JPEGs and
// 320x240 RGB PNGs, MNIST digits over noise) in 4 classes.
func benchFolder(b *testing.B, n int) string {
	root := b.TempDir()
	rng := rand.New(rand.NewPCG(1, 1))
	for i := range n {
		d, _ := digit(b, uint8(i%10))
		w, h, ext := 256, 256, "jpg"
		if i%2 == 1 {
			w, h, ext = 320, 240, "png"
		}
		img := image.NewRGBA(image.Rect(0, 0, w, h))
		s := scaled(d, w, h)
		for p, v := range s.Pix {
			img.Pix[4*p] = v/2 + uint8(rng.IntN(64))
			img.Pix[4*p+1] = 255 - v/2 - uint8(rng.IntN(64))
			img.Pix[4*p+2] = uint8(p%w) ^ uint8(p/w)
			img.Pix[4*p+3] = 255
		}
		writeImage(b, filepath.Join(root, fmt.Sprintf("class%d", i%4), fmt.Sprintf("%03d.%s", i, ext)), img)
	}
	return root
}

const benchImages = 64

var benchShape = Shape{128, 128, 3}

func reportImagesPerSecond(b *testing.B, start time.Time) {
	b.ReportMetric(float64(benchImages*b.N)/time.Since(start).Seconds(), "images/s")
}

// BenchmarkImageFolderCold: decoding and resizing to 128x128 RGB, on all
// cores (what a first run pays per image).
func BenchmarkImageFolderCold(b *testing.B) {
	root := benchFolder(b, benchImages)
	b.ResetTimer()
	start := time.Now()
	for range b.N {
		ds, err := OpenImageFolder(root, ImageFolderOptions{Shape: benchShape, NoCache: true})
		if err != nil {
			b.Fatal(err)
		}
		ds.Close()
	}
	reportImagesPerSecond(b, start)
}

// BenchmarkImageFolderWarm: opening a folder whose cache is up to date
// (stat every file, verify every cached image's checksum) and reading
// every image once.
func BenchmarkImageFolderWarm(b *testing.B) { benchmarkWarm(b, false) }

// BenchmarkImageFolderWarmRehash: the same, reading and hashing every
// file too (Rehash): what keying the cache on content alone would cost.
func BenchmarkImageFolderWarmRehash(b *testing.B) { benchmarkWarm(b, true) }

func benchmarkWarm(b *testing.B, rehash bool) {
	root := benchFolder(b, benchImages)
	ds, err := OpenImageFolder(root, ImageFolderOptions{Shape: benchShape})
	if err != nil {
		b.Fatal(err)
	}
	ds.Close()
	// The files were written just now: let the cache trust their keys
	// as it does for any folder not written in the seconds before a run.
	ageCache(b, cacheFileOf(b, root, benchShape))
	buf := make([]uint8, benchShape.Size())
	b.ResetTimer()
	start := time.Now()
	for range b.N {
		ds, err := OpenImageFolder(root, ImageFolderOptions{Shape: benchShape, Rehash: rehash})
		if err != nil || ds.Report().Decoded != 0 || ds.Report().CacheStatus != "hit" {
			b.Fatal(err, ds.Report().CacheStatus)
		}
		for i := range ds.Len() {
			if err := ds.ReadImage(i, buf); err != nil {
				b.Fatal(err)
			}
		}
		ds.Close()
	}
	reportImagesPerSecond(b, start)
}

// BenchmarkLoaderEpoch: shuffled batches of 32 from a cached folder.
func BenchmarkLoaderEpoch(b *testing.B) {
	root := benchFolder(b, benchImages)
	ds, err := OpenImageFolder(root, ImageFolderOptions{Shape: benchShape})
	if err != nil {
		b.Fatal(err)
	}
	defer ds.Close()
	l, err := NewLoader(ds, LoaderOptions{BatchSize: 32, Seed: 1})
	if err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	start := time.Now()
	for epoch := range b.N {
		for _, err := range l.Epoch(context.Background(), epoch, 0) {
			if err != nil {
				b.Fatal(err)
			}
		}
	}
	reportImagesPerSecond(b, start)
}
