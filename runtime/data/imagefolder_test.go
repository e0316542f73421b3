package data

import (
	"encoding/binary"
	"errors"
	"image"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// fixtureFile is an image written into a test ImageFolder with the pixels
// (native size, before resizing) that decoding it must give.
type fixtureFile struct {
	rel   string
	label int32
	w, h  int
	rgb   []uint8 // 3-channel pixels
	gray  []uint8 // 1-channel pixels
	lossy bool    // JPEG: the pixels are what the file decodes to
}

// fixtureClasses are created in this (unsorted) order; labels follow the
// sorted names: ones 0, sevens 1, zeros 2.
var fixtureClasses = []struct {
	name  string
	digit uint8
}{{"zeros", 0}, {"sevens", 7}, {"ones", 1}}

// makeFolder writes a three-class ImageFolder from real MNIST digits: per
// class a gray PNG, an RGBA PNG (alpha varying, other size), a paletted
// PNG, a 16-bit gray PNG, a colour JPEG, a GIF, a BMP, a text file (to be
// ignored) and a gray JPEG in a sub-folder, with an upper-case extension.
func makeFolder(t testing.TB) (string, []fixtureFile) {
	root := t.TempDir()
	var files []fixtureFile
	for _, c := range fixtureClasses {
		d, _ := digit(t, c.digit)
		add := func(name string, img image.Image, lossy bool) {
			p := filepath.Join(root, c.name, filepath.FromSlash(name))
			writeImage(t, p, img)
			f := fixtureFile{rel: c.name + "/" + name, w: img.Bounds().Dx(), h: img.Bounds().Dy(), lossy: lossy}
			if lossy {
				// JPEG's loss is the codec's business (checked against
				// Pillow in decode_test.go): expect the decoded pixels.
				encoded, err := os.ReadFile(p)
				require.NoError(t, err)
				f.rgb, _, _, err = decodeImage(encoded, 3)
				require.NoError(t, err)
				f.gray, _, _, err = decodeImage(encoded, 1)
				require.NoError(t, err)
			} else {
				f.rgb, _, _ = convertChannels(img, 3, "")
				f.gray, _, _ = convertChannels(img, 1, "")
			}
			files = append(files, f)
		}
		add("a.png", d, false)
		add("b_rgba.PNG", tinted(scaled(d, 40, 33), 255, 128, 0), false)
		add("c_pal.png", paletted(d), false)
		add("d_16.png", gray16(scaled(d, 30, 30)), false)
		add("e.jpg", tinted(scaled(d, 50, 50), 40, 255, 200), true)
		add("f.gif", paletted(scaled(d, 31, 29)), false)
		opaque := image.NewRGBA(image.Rect(0, 0, 28, 28))
		for i, v := range d.Pix {
			opaque.Pix[4*i], opaque.Pix[4*i+1], opaque.Pix[4*i+2], opaque.Pix[4*i+3] = v, 255-v, v/2, 255
		}
		add("g.bmp", opaque, false)
		require.NoError(t, os.WriteFile(filepath.Join(root, c.name, "notes.txt"), []byte("not an image"), 0o644))
		add("sub/h.JPEG", scaled(d, 28, 36), true)
	}
	// labels and torchvision's order: classes sorted, then files.
	labels := map[string]int32{"ones": 0, "sevens": 1, "zeros": 2}
	for i := range files {
		files[i].label = labels[strings.Split(files[i].rel, "/")[0]]
	}
	sortFixture(files)
	return root, files
}

func sortFixture(files []fixtureFile) {
	// Within a class the fixture's names already sort in walk order
	// (top-level files, then sub/); only the classes need sorting.
	for i := 1; i < len(files); i++ {
		for j := i; j > 0 && files[j].label < files[j-1].label; j-- {
			files[j], files[j-1] = files[j-1], files[j]
		}
	}
}

func openFolder(t testing.TB, root string, opts ImageFolderOptions) *ImageFolder {
	t.Helper()
	ds, err := OpenImageFolder(root, opts)
	require.NoError(t, err)
	t.Cleanup(func() { ds.Close() })
	return ds
}

func readAll(t testing.TB, ds Dataset) [][]uint8 {
	t.Helper()
	out := make([][]uint8, ds.Len())
	for i := range out {
		out[i] = make([]uint8, ds.Shape().Size())
		require.NoError(t, ds.ReadImage(i, out[i]))
	}
	return out
}

func TestImageFolderLabelsOrderChannelsAndResize(t *testing.T) {
	root, files := makeFolder(t)
	for _, shape := range []Shape{{28, 28, 1}, {28, 28, 3}, {20, 36, 3}, {64, 48, 1}} {
		ds := openFolder(t, root, ImageFolderOptions{Shape: shape, NoCache: true})
		assert.Equal(t, []string{"ones", "sevens", "zeros"}, ds.Classes())
		assert.Equal(t, 3, ds.NumClasses())
		require.Equal(t, len(files), ds.Len())
		assert.Equal(t, 3, len(ds.Report().Ignored), "the notes.txt files")
		images := readAll(t, ds)
		for i, f := range files {
			assert.Equal(t, filepath.Join(root, filepath.FromSlash(f.rel)), ds.Path(i))
			assert.Equal(t, f.label, ds.Label(i), f.rel)
			native := f.rgb
			if shape.C == 1 {
				native = f.gray
			}
			// The independent float64 filter, rounded between passes as
			// Pillow does, is within 1 of what we serve.
			want := referenceResize(native, f.w, f.h, shape.C, shape.W, shape.H, true)
			mean, mx := pixelDiff(images[i], want)
			assert.LessOrEqual(t, mx, 1, "%s at %v: mean %.3f", f.rel, shape, mean)
			if f.w == shape.W && f.h == shape.H {
				assert.Equal(t, native, images[i], "%s: same size, no resampling", f.rel)
			}
		}
	}
}

// addBad puts bad things into a fixture folder: a truncated PNG, a text
// file named .jpg, a PPM and an empty class folder ("xempty", label 2).
func addBad(t *testing.T, root string) (corrupt, fake, ppm, empty string) {
	corrupt = filepath.Join(root, "sevens", "zz_corrupt.png")
	good, err := os.ReadFile(filepath.Join(root, "sevens", "a.png"))
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(corrupt, good[:len(good)/2], 0o644))
	fake = filepath.Join(root, "zeros", "fake.jpg")
	require.NoError(t, os.WriteFile(fake, []byte("this is a text file"), 0o644))
	ppm = filepath.Join(root, "zeros", "pic.ppm")
	require.NoError(t, os.WriteFile(ppm, []byte("P6\n1 1\n255\n\x00\x00\x00"), 0o644))
	empty = filepath.Join(root, "xempty")
	require.NoError(t, os.Mkdir(empty, 0o755))
	return
}

func TestImageFolderErrorsNameThePath(t *testing.T) {
	shape := Shape{28, 28, 1}
	dir := t.TempDir()
	_, err := OpenImageFolder(filepath.Join(dir, "nope"), ImageFolderOptions{Shape: shape})
	assert.EqualError(t, err, filepath.Join(dir, "nope")+": image folder does not exist")

	file := filepath.Join(dir, "file")
	require.NoError(t, os.WriteFile(file, nil, 0o644))
	_, err = OpenImageFolder(file, ImageFolderOptions{Shape: shape})
	assert.ErrorContains(t, err, file+": not a folder")

	_, err = OpenImageFolder(dir, ImageFolderOptions{Shape: shape})
	assert.ErrorContains(t, err, dir+": no class folders")

	require.NoError(t, os.Mkdir(filepath.Join(dir, "cats"), 0o755))
	_, err = OpenImageFolder(dir, ImageFolderOptions{Shape: shape})
	assert.ErrorContains(t, err, filepath.Join(dir, "cats")+`: class folder "cats" has no images`)
	_, err = OpenImageFolder(dir, ImageFolderOptions{Shape: shape, SkipBad: true})
	assert.ErrorContains(t, err, dir+": no images in its 1 class folder(s)")

	_, err = OpenImageFolder(dir, ImageFolderOptions{Shape: Shape{28, 28, 4}})
	assert.ErrorContains(t, err, dir+": images have 4 channels")

	root, _ := makeFolder(t)
	corrupt, fake, ppm, empty := addBad(t, root)
	_, err = OpenImageFolder(root, ImageFolderOptions{Shape: shape})
	assert.ErrorContains(t, err, empty+`: class folder "xempty" has no images`)
	require.NoError(t, os.Remove(empty))

	// The first bad file in folder order, whatever the decoding order.
	for range 5 {
		_, err = OpenImageFolder(root, ImageFolderOptions{Shape: shape, Workers: 4})
		require.Error(t, err)
		assert.True(t, strings.HasPrefix(err.Error(), corrupt+": corrupt image: png"), err.Error())
		var fe *FileError
		require.True(t, errors.As(err, &fe))
		assert.Equal(t, corrupt, fe.Path)
	}
	require.NoError(t, os.Remove(corrupt))
	_, err = OpenImageFolder(root, ImageFolderOptions{Shape: shape})
	assert.EqualError(t, err, fake+": not a JPEG, PNG, GIF, BMP, WebP or TIFF image; remove or replace it, or skip bad images (--skip-bad)")
	require.NoError(t, os.Remove(fake))
	_, err = OpenImageFolder(root, ImageFolderOptions{Shape: shape})
	assert.EqualError(t, err, ppm+": PPM/PGM images are not supported (convert them to PNG); remove or replace it, or skip bad images (--skip-bad)")
	require.NoError(t, os.Remove(ppm))

	dangling := filepath.Join(root, "ones", "link.png")
	require.NoError(t, os.Symlink(filepath.Join(root, "gone.png"), dangling))
	_, err = OpenImageFolder(root, ImageFolderOptions{Shape: shape})
	assert.ErrorContains(t, err, dangling+": ")
	require.NoError(t, os.Remove(dangling))

	// No failed open left a cache or a temporary file behind, and nothing
	// was ever written into the data folder.
	left, _ := filepath.Glob(filepath.Join(filepath.Dir(cacheFileOf(t, root, shape)), "*"))
	assert.Empty(t, left)
	assertOnlyImagesIn(t, root)
}

func TestImageFolderSkipBad(t *testing.T) {
	root, files := makeFolder(t)
	corrupt, fake, ppm, empty := addBad(t, root)
	var warned []string
	opts := ImageFolderOptions{Shape: Shape{28, 28, 3}, SkipBad: true, Warn: func(m string) { warned = append(warned, m) }}
	ds := openFolder(t, root, opts)
	rep := ds.Report()
	assert.Equal(t, len(files), ds.Len())
	assert.Equal(t, []string{"ones", "sevens", "xempty", "zeros"}, ds.Classes())
	assert.Equal(t, 4, ds.NumClasses(), "an empty class keeps its label")
	assert.Equal(t, int32(3), ds.Label(ds.Len()-1), "zeros come after xempty")
	require.Len(t, rep.Skipped, 3)
	assert.Equal(t, []string{corrupt, fake, ppm}, []string{rep.Skipped[0].Path, rep.Skipped[1].Path, rep.Skipped[2].Path})
	assert.Contains(t, rep.Skipped[1].Reason, "not a JPEG")
	assert.Equal(t, []string{empty}, rep.EmptyClasses)
	assert.Equal(t, len(files)+3, rep.Files)
	assert.Equal(t, rep.Warnings, warned)
	assert.True(t, containsSubstring(warned, "skipped "+corrupt))
	assert.True(t, containsSubstring(warned, empty+`: class folder "xempty" has no images`))
	for i := range ds.Len() {
		assert.NotContains(t, ds.Path(i), "zz_corrupt")
	}

	// The bad files are remembered by the cache: no decoding next time,
	// same report; and without SkipBad the cached verdict is an error.
	ds2 := openFolder(t, root, opts)
	assert.Equal(t, 0, ds2.Report().Decoded)
	assert.Equal(t, "hit", ds2.Report().CacheStatus)
	assert.Equal(t, rep.Skipped, ds2.Report().Skipped)
	require.NoError(t, os.Remove(empty))
	_, err := OpenImageFolder(root, ImageFolderOptions{Shape: opts.Shape})
	assert.ErrorContains(t, err, corrupt+": corrupt image")

	// A class whose every file is bad is reported like an empty one.
	require.NoError(t, os.RemoveAll(filepath.Join(root, "ones")))
	require.NoError(t, os.MkdirAll(filepath.Join(root, "ones"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(root, "ones", "x.png"), []byte("junk"), 0o644))
	ds3 := openFolder(t, root, ImageFolderOptions{Shape: opts.Shape, SkipBad: true})
	assert.Equal(t, []string{filepath.Join(root, "ones")}, ds3.Report().EmptyClasses)

	// Nothing usable at all is an error.
	only := t.TempDir()
	require.NoError(t, os.Mkdir(filepath.Join(only, "c"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(only, "c", "x.png"), []byte("junk"), 0o644))
	_, err = OpenImageFolder(only, ImageFolderOptions{Shape: opts.Shape, SkipBad: true})
	assert.EqualError(t, err, only+": no usable images: all 1 image files are bad")
}

func containsSubstring(list []string, sub string) bool {
	for _, s := range list {
		if strings.Contains(s, sub) {
			return true
		}
	}
	return false
}

func TestImageFolderCache(t *testing.T) {
	root, files := makeFolder(t)
	shape := Shape{32, 32, 3}
	opts := ImageFolderOptions{Shape: shape}
	cachePath := cacheFileOf(t, root, shape)

	first := openFolder(t, root, opts)
	assert.Equal(t, len(files), first.Report().Decoded)
	assert.Equal(t, "created", first.Report().CacheStatus)
	assert.Equal(t, cachePath, first.Report().CacheFile)
	want := readAll(t, first)

	hit := openFolder(t, root, opts)
	assert.Equal(t, 0, hit.Report().Decoded, "a warm open decodes nothing")
	assert.Equal(t, "hit", hit.Report().CacheStatus)
	assert.Equal(t, want, readAll(t, hit))
	left, _ := filepath.Glob(filepath.Join(filepath.Dir(cachePath), ".cnnc-cache-*.tmp"))
	assert.Empty(t, left, "no temporary files left")
	assertOnlyImagesIn(t, root)

	// Another shape is another cache.
	other := openFolder(t, root, ImageFolderOptions{Shape: Shape{32, 32, 1}})
	assert.Equal(t, len(files), other.Report().Decoded)

	later := time.Now().Add(time.Hour)
	// A changed file: only it is decoded, and its new pixels are served.
	changed := filepath.Join(root, "ones", "a.png")
	d, _ := digit(t, 4)
	writeImage(t, changed, d)
	require.NoError(t, os.Chtimes(changed, later, later))
	upd := openFolder(t, root, opts)
	assert.Equal(t, 1, upd.Report().Decoded)
	assert.Equal(t, len(files)-1, upd.Report().Reused)
	assert.Equal(t, "updated", upd.Report().CacheStatus)
	got := readAll(t, upd)
	assert.NotEqual(t, want[0], got[0])
	assert.Equal(t, want[1:], got[1:])
	four := resizeBilinear(func() []uint8 { p, _, _ := convertChannels(d, 3, ""); return p }(), 28, 28, 3, 32, 32)
	assert.Equal(t, four, got[0])

	// An added file.
	added := filepath.Join(root, "zeros", "zz_new.png")
	writeImage(t, added, d)
	add := openFolder(t, root, opts)
	assert.Equal(t, 1, add.Report().Decoded)
	assert.Equal(t, len(files)+1, add.Len())
	assert.Equal(t, added, add.Path(add.Len()-2), "before zeros/sub/h.JPEG, in walk order")

	// A removed file: nothing to decode, but the cache is rewritten.
	require.NoError(t, os.Remove(filepath.Join(root, "sevens", "c_pal.png")))
	rm := openFolder(t, root, opts)
	assert.Equal(t, 0, rm.Report().Decoded)
	assert.Equal(t, "updated", rm.Report().CacheStatus)
	assert.Equal(t, len(files), rm.Len())
	assert.Equal(t, "hit", openFolder(t, root, opts).Report().CacheStatus)

	// Touched, same bytes: the hash recognises it; no decoding.
	touched := filepath.Join(root, "zeros", "f.gif")
	later2 := later.Add(time.Hour)
	require.NoError(t, os.Chtimes(touched, later2, later2))
	tch := openFolder(t, root, opts)
	assert.Equal(t, 0, tch.Report().Decoded)
	assert.Equal(t, "updated", tch.Report().CacheStatus)

	// Rehash reads every file; on an unchanged folder it rewrites nothing.
	rh := openFolder(t, root, ImageFolderOptions{Shape: shape, Rehash: true})
	assert.Equal(t, "hit", rh.Report().CacheStatus)
	assert.Equal(t, 0, rh.Report().Decoded)
	assert.Equal(t, rh.Len(), rh.Report().Hashed)
}

// indexOf is the sample index of path in ds.
func indexOf(t *testing.T, ds *ImageFolder, path string) int {
	t.Helper()
	for i := range ds.Len() {
		if ds.Path(i) == path {
			return i
		}
	}
	t.Fatalf("%s is not a sample", path)
	return -1
}

// sameSizeOtherPixels is a BMP of the fixture's size (so of the same file
// size as the fixture's BMPs) whose first pixel is white.
func sameSizeOtherPixels(t *testing.T) []byte {
	inverted := image.NewRGBA(image.Rect(0, 0, 28, 28))
	for i := range inverted.Pix {
		inverted.Pix[i] = 255
	}
	tmp := filepath.Join(t.TempDir(), "x.bmp")
	writeImage(t, tmp, inverted)
	b, err := os.ReadFile(tmp)
	require.NoError(t, err)
	return b
}

// Files replaced with their size and mtime kept — as `cp -p` (which
// writes into the file) and `rsync -a` (which renames a new file over it)
// replace them — are decoded again: the cache's key includes the change
// time and the inode, which no copy can set.
func TestImageFolderCacheSeesFilesReplacedWithTheirMtimeKept(t *testing.T) {
	for _, how := range []string{"cp -p", "rsync -a", "cp -p (command)"} {
		t.Run(how, func(t *testing.T) {
			root, _ := makeFolder(t)
			shape := Shape{32, 32, 3}
			opts := ImageFolderOptions{Shape: shape}
			bmpPath := filepath.Join(root, "zeros", "g.bmp")
			first := openFolder(t, root, opts)
			idx := indexOf(t, first, bmpPath)
			img := make([]uint8, shape.Size())
			require.NoError(t, first.ReadImage(idx, img))
			require.NotEqual(t, uint8(255), img[0])
			// Let the cache's keys age past the racy window, as they have
			// on any folder not written in the seconds before a run.
			ageCache(t, cacheFileOf(t, root, shape))
			assert.Equal(t, 0, openFolder(t, root, opts).Report().Hashed, "an unchanged folder is not read")

			st, err := os.Stat(bmpPath)
			require.NoError(t, err)
			other := sameSizeOtherPixels(t)
			switch how {
			case "cp -p":
				require.NoError(t, os.WriteFile(bmpPath, other, 0o644))
			case "rsync -a":
				tmp := filepath.Join(root, "zeros", ".g.bmp.rsync")
				require.NoError(t, os.WriteFile(tmp, other, 0o644))
				require.NoError(t, os.Chtimes(tmp, st.ModTime(), st.ModTime()))
				require.NoError(t, os.Rename(tmp, bmpPath))
			case "cp -p (command)":
				src := filepath.Join(t.TempDir(), "src.bmp")
				require.NoError(t, os.WriteFile(src, other, 0o644))
				require.NoError(t, os.Chtimes(src, st.ModTime(), st.ModTime()))
				out, err := exec.Command("cp", "-p", src, bmpPath).CombinedOutput()
				require.NoError(t, err, string(out))
			}
			require.NoError(t, os.Chtimes(bmpPath, st.ModTime(), st.ModTime()))
			st2, err := os.Stat(bmpPath)
			require.NoError(t, err)
			require.Equal(t, st.Size(), st2.Size())
			require.Equal(t, st.ModTime(), st2.ModTime())

			ds := openFolder(t, root, opts)
			assert.Equal(t, 1, ds.Report().Decoded, "the replaced file, and only it")
			assert.Equal(t, "updated", ds.Report().CacheStatus)
			require.NoError(t, ds.ReadImage(indexOf(t, ds, bmpPath), img))
			assert.Equal(t, uint8(255), img[0], "its new pixels are served")
		})
	}
}

// ageCache records a cache's scan as made a minute later than it was: its
// records then describe files last changed well before the scan (not
// racily clean).
func ageCache(t testing.TB, path string) {
	t.Helper()
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	scan := int64(binary.LittleEndian.Uint64(b[44:]))
	binary.LittleEndian.PutUint64(b[44:], uint64(scan+int64(time.Minute)))
	copy(b[60:], crcBytes(b[:60]))
	require.NoError(t, os.WriteFile(path, b, 0o644))
}

// Files changed within the racy window of the scan that recorded them
// (timestamps are coarse) are hashed on the next open, not trusted.
func TestImageFolderCacheHashesRacilyCleanFiles(t *testing.T) {
	root, files := makeFolder(t)
	opts := ImageFolderOptions{Shape: Shape{8, 8, 1}}
	openFolder(t, root, opts)
	again := openFolder(t, root, opts)
	assert.Equal(t, "hit", again.Report().CacheStatus)
	assert.Equal(t, len(files), again.Report().Hashed, "all were written just before the first scan")
	assert.Equal(t, 0, again.Report().Decoded)
}

func TestImageFolderDamagedCacheIsRebuilt(t *testing.T) {
	root, files := makeFolder(t)
	opts := ImageFolderOptions{Shape: Shape{24, 24, 3}}
	cachePath := cacheFileOf(t, root, opts.Shape)
	want := readAll(t, openFolder(t, root, opts))
	good, err := os.ReadFile(cachePath)
	require.NoError(t, err)
	slot := opts.Shape.Size()

	flip := func(off int) []byte {
		b := append([]byte(nil), good...)
		b[off] ^= 0x40
		return b
	}
	for _, tc := range []struct {
		name, reason string
		content      []byte
	}{
		{"empty", "truncated header", nil},
		{"garbage", "bad magic", []byte(strings.Repeat("garbage!", 100))},
		{"truncated", "truncated or overwritten", good[:len(good)-10]},
		{"truncated payload", "truncated or overwritten", good[:cacheHeaderSize+slot]},
		{"appended", "truncated or overwritten", append(append([]byte(nil), good...), 0)},
		{"header", "header checksum mismatch", flip(17)},
		{"pixel", "checksum mismatch in the image of ones/b_rgba.PNG", flip(cacheHeaderSize + slot + 5)},
		{"table", "table checksum mismatch", flip(len(good) - 3)},
	} {
		require.NoError(t, os.WriteFile(cachePath, tc.content, 0o644))
		ds := openFolder(t, root, opts)
		rep := ds.Report()
		assert.Equal(t, len(files), rep.Decoded, tc.name)
		assert.True(t, containsSubstring(rep.Warnings, cachePath+": cache unusable ("), "%s: %v", tc.name, rep.Warnings)
		assert.True(t, containsSubstring(rep.Warnings, tc.reason), "%s: %v", tc.name, rep.Warnings)
		assert.Equal(t, want, readAll(t, ds), tc.name)
		rebuilt, err := os.ReadFile(cachePath)
		require.NoError(t, err)
		assert.Equal(t, withoutScanTime(good), withoutScanTime(rebuilt), "%s: rebuilt byte for byte", tc.name)
	}
	// A FIFO where the cache should be is refused without blocking, and
	// replaced.
	require.NoError(t, os.Remove(cachePath))
	require.NoError(t, syscall.Mkfifo(cachePath, 0o644))
	require.NoError(t, notBlocking(t, func() error {
		ds, err := OpenImageFolder(root, opts)
		if err == nil {
			assert.True(t, containsSubstring(ds.Report().Warnings, cachePath+": cache unusable (is a named pipe (FIFO), not a regular file)"), "%v", ds.Report().Warnings)
			ds.Close()
		}
		return err
	}))
	st, err := os.Lstat(cachePath)
	require.NoError(t, err)
	assert.True(t, st.Mode().IsRegular())
	// A cache of another pipeline version is not used either.
	b := append([]byte(nil), good...)
	b[12]++
	copy(b[60:], crcBytes(b[:60]))
	require.NoError(t, os.WriteFile(cachePath, b, 0o644))
	rep := openFolder(t, root, opts).Report()
	assert.True(t, containsSubstring(rep.Warnings, "made by image pipeline version 2, want 1"), "%v", rep.Warnings)
}

// withoutScanTime is a cache file without the header's scan time and
// checksum, which differ between two builds of the same folder.
func withoutScanTime(b []byte) []byte {
	out := append([]byte(nil), b...)
	if len(out) >= cacheHeaderSize {
		clear(out[44:52])
		clear(out[60:64])
	}
	return out
}

func crcBytes(b []byte) []byte {
	var out [4]byte
	c := crc32Castagnoli(b)
	out[0], out[1], out[2], out[3] = byte(c), byte(c>>8), byte(c>>16), byte(c>>24)
	return out[:]
}

// Caches go to the user's cache folder, never into the data folder
// (where PyTorch's ImageFolder would find them); a cache folder that
// cannot be written leaves the images in memory, with a warning.
func TestImageFolderCacheLocation(t *testing.T) {
	root, files := makeFolder(t)
	var warned []string
	opts := ImageFolderOptions{Shape: Shape{16, 16, 1}, Warn: func(m string) { warned = append(warned, m) }}
	ds := openFolder(t, root, opts)
	rep := ds.Report()
	assert.Equal(t, len(files), rep.Decoded)
	assert.Equal(t, cacheFileOf(t, root, opts.Shape), rep.CacheFile)
	assert.True(t, strings.HasPrefix(filepath.Base(rep.CacheFile), filepath.Base(root)+"-"), rep.CacheFile)
	assert.True(t, strings.HasSuffix(rep.CacheFile, "-16x16x1.bin"))
	st, err := os.Stat(rep.CacheFile)
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o644), st.Mode().Perm())
	assert.False(t, containsSubstring(warned, "cache"), "%v", warned)
	assertOnlyImagesIn(t, root)

	// The same folder through a link: the same cache.
	link := filepath.Join(t.TempDir(), "link")
	require.NoError(t, os.Symlink(root, link))
	viaLink := openFolder(t, link, opts)
	assert.Equal(t, rep.CacheFile, viaLink.Report().CacheFile)
	assert.Equal(t, "hit", viaLink.Report().CacheStatus)

	// A cache folder that cannot be written: the images stay in memory.
	oldCreate := createCacheTemp
	defer func() { createCacheTemp = oldCreate }()
	createCacheTemp = func(dir string) (*os.File, error) {
		return nil, &os.PathError{Op: "open", Path: dir, Err: errors.New("read-only file system")}
	}
	require.NoError(t, os.Remove(rep.CacheFile))
	mem := openFolder(t, root, opts)
	assert.Equal(t, "", mem.Report().CacheFile)
	assert.True(t, strings.HasPrefix(mem.Report().CacheStatus, "not saved: "), mem.Report().CacheStatus)
	assert.True(t, containsSubstring(warned, "read-only file system); the images (0 MiB) stay in memory"), "%v", warned)
	assert.Equal(t, readAll(t, ds), readAll(t, mem))

	// No user cache folder at all: likewise.
	oldUser := userCacheDir
	defer func() { userCacheDir = oldUser }()
	userCacheDir = func() (string, error) { return "", errors.New("neither $XDG_CACHE_HOME nor $HOME are defined") }
	mem = openFolder(t, root, opts)
	assert.Equal(t, "", mem.Report().CacheFile)
	assert.Equal(t, readAll(t, ds), readAll(t, mem))
	assertOnlyImagesIn(t, root)
}

// CacheDir holds the caches instead of the user's cache folder; two data
// folders of the same name never share a file.
func TestImageFolderCacheDirOption(t *testing.T) {
	dir := t.TempDir()
	shape := Shape{8, 8, 3}
	var roots []string
	for range 2 {
		root, _ := makeFolder(t)
		same := filepath.Join(root, "data")
		require.NoError(t, os.Mkdir(same, 0o755))
		for _, c := range []string{"ones", "sevens", "zeros"} {
			require.NoError(t, os.Rename(filepath.Join(root, c), filepath.Join(same, c)))
		}
		roots = append(roots, same)
	}
	// Different pictures under the same name: each folder its own cache.
	d, _ := digit(t, 5)
	writeImage(t, filepath.Join(roots[1], "ones", "a.png"), d)
	var caches []string
	for _, root := range roots {
		ds := openFolder(t, root, ImageFolderOptions{Shape: shape, CacheDir: dir})
		assert.Equal(t, dir, filepath.Dir(ds.Report().CacheFile))
		assert.Equal(t, "created", ds.Report().CacheStatus)
		caches = append(caches, ds.Report().CacheFile)
		assertOnlyImagesIn(t, root)
	}
	assert.NotEqual(t, caches[0], caches[1])
	a := readAll(t, openFolder(t, roots[0], ImageFolderOptions{Shape: shape, CacheDir: dir}))
	b := readAll(t, openFolder(t, roots[1], ImageFolderOptions{Shape: shape, CacheDir: dir}))
	assert.NotEqual(t, a[0], b[0])
	assert.Equal(t, a[1:], b[1:])
	_, err := os.Stat(cacheFileOf(t, roots[0], shape))
	assert.True(t, errors.Is(err, os.ErrNotExist), "the user cache folder is not used")
}

// A cache an older cnnc left in the data folder is not used; a warning
// says it can go.
func TestImageFolderWarnsOfACacheInTheDataFolder(t *testing.T) {
	root, _ := makeFolder(t)
	old := filepath.Join(root, ".cnnc-cache-8x8x1.bin")
	require.NoError(t, os.WriteFile(old, []byte("CNNCIMG\n"), 0o644))
	ds := openFolder(t, root, ImageFolderOptions{Shape: Shape{8, 8, 1}})
	assert.True(t, containsSubstring(ds.Report().Warnings, old+": an image cache left in the data folder by an older cnnc"), "%v", ds.Report().Warnings)
	assert.NotEqual(t, old, ds.Report().CacheFile)
}

func TestImageFolderProgressAndReadErrors(t *testing.T) {
	root, files := makeFolder(t)
	calls := 0
	ds := openFolder(t, root, ImageFolderOptions{Shape: Shape{8, 8, 1}, Progress: func(done, total int) {
		calls++
		assert.Equal(t, len(files), total)
		assert.Equal(t, calls, done)
	}})
	assert.Equal(t, len(files), calls)
	assert.ErrorContains(t, ds.ReadImage(len(files), make([]uint8, 64)), "out of range")
	assert.ErrorContains(t, ds.ReadImage(0, make([]uint8, 3)), "destination holds 3 bytes, an image is 64")
	require.NoError(t, ds.Close())
	require.NoError(t, ds.Close(), "closing twice is harmless")
}

// TestImageFolderMixedSizesAndModesInOneClass: every layout in one folder.
func TestImageFolderMixedSizesAndModesInOneClass(t *testing.T) {
	root := t.TempDir()
	d, _ := digit(t, 2)
	writeImage(t, filepath.Join(root, "two", "1.png"), d)
	writeImage(t, filepath.Join(root, "two", "2.png"), tinted(scaled(d, 100, 20), 1, 2, 3))
	writeImage(t, filepath.Join(root, "two", "3.png"), gray16(d))
	writeImage(t, filepath.Join(root, "two", "4.gif"), paletted(scaled(d, 9, 90)))
	writeImage(t, filepath.Join(root, "two", "5.jpg"), image.NewCMYK(image.Rect(0, 0, 3, 3))) // encoded as YCbCr
	writeImage(t, filepath.Join(root, "two", "6.bmp"), scaled(d, 13, 17))
	ds := openFolder(t, root, ImageFolderOptions{Shape: Shape{28, 28, 3}, NoCache: true})
	assert.Equal(t, 6, ds.Len())
	assert.Equal(t, "disabled", ds.Report().CacheStatus)
}

// A file that cannot be read (permission denied, an I/O error) is
// skipped, never remembered as bad: after `chmod 644` it is read, decoded
// and served. (Root reads any file, so the test also makes the read fail
// as it fails for other users.)
func TestImageFolderUnreadableFilesAreNotRememberedAsBad(t *testing.T) {
	root, files := makeFolder(t)
	locked := filepath.Join(root, "sevens", "c_pal.png")
	oldRead := readImageFile
	defer func() { readImageFile = oldRead }()
	readImageFile = func(path string, max int64) ([]byte, fs.FileInfo, error) {
		if path == locked {
			return nil, nil, &fs.PathError{Op: "open", Path: path, Err: syscall.EACCES}
		}
		return oldRead(path, max)
	}
	require.NoError(t, os.Chmod(locked, 0o000))
	shape := Shape{16, 16, 3}

	_, err := OpenImageFolder(root, ImageFolderOptions{Shape: shape})
	assert.EqualError(t, err, locked+": permission denied; remove or replace it, or skip bad images (--skip-bad)")
	ds := openFolder(t, root, ImageFolderOptions{Shape: shape, SkipBad: true})
	assert.Equal(t, []BadFile{{Path: locked, Reason: "permission denied"}}, ds.Report().Skipped)
	assert.Equal(t, len(files)-1, ds.Len())

	// Still unreadable: tried again (and skipped again), not taken from
	// the cache as a verdict.
	ds = openFolder(t, root, ImageFolderOptions{Shape: shape, SkipBad: true})
	assert.Equal(t, []BadFile{{Path: locked, Reason: "permission denied"}}, ds.Report().Skipped)
	assert.Equal(t, "updated", ds.Report().CacheStatus)

	readImageFile = oldRead
	require.NoError(t, os.Chmod(locked, 0o644))
	for _, opts := range []ImageFolderOptions{{Shape: shape, SkipBad: true}, {Shape: shape}} {
		ds = openFolder(t, root, opts)
		assert.Empty(t, ds.Report().Skipped)
		assert.Equal(t, len(files), ds.Len())
		indexOf(t, ds, locked)
	}
	assert.Equal(t, "hit", ds.Report().CacheStatus)
}

// An image-named FIFO or link to /dev/zero is refused by name at once,
// never opened or read; with SkipBad it is skipped and reported.
func TestImageFolderNonRegularFilesAreRefused(t *testing.T) {
	root, files := makeFolder(t)
	fifo := filepath.Join(root, "ones", "fifo.png")
	require.NoError(t, syscall.Mkfifo(fifo, 0o644))
	zero := filepath.Join(root, "sevens", "zero.png")
	require.NoError(t, os.Symlink("/dev/zero", zero))
	shape := Shape{8, 8, 1}

	err := notBlocking(t, func() error { _, err := OpenImageFolder(root, ImageFolderOptions{Shape: shape}); return err })
	assert.EqualError(t, err, fifo+": is a named pipe (FIFO), not a regular file; remove or replace it, or skip bad images (--skip-bad)")
	var fe *FileError
	require.True(t, errors.As(err, &fe))
	assert.True(t, fe.Skippable)

	want := []BadFile{{fifo, "is a named pipe (FIFO), not a regular file"}, {zero, "is a character device, not a regular file"}}
	for _, status := range []string{"created", "hit"} {
		var ds *ImageFolder
		require.NoError(t, notBlocking(t, func() error {
			var err error
			ds, err = OpenImageFolder(root, ImageFolderOptions{Shape: shape, SkipBad: true})
			return err
		}))
		assert.Equal(t, want, ds.Report().Skipped)
		assert.Equal(t, len(files), ds.Len())
		assert.Equal(t, status, ds.Report().CacheStatus)
		ds.Close()
	}
}
