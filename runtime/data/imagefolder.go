package data

// ImageFolder: torchvision's ROOT/CLASS/.../IMAGE layout, decoded once in
// parallel into one cache file (cache.go) and served from it.

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
)

// ImageFolderOptions configure OpenImageFolder.
type ImageFolderOptions struct {
	// Shape is the model's input: every image is resized to H x W and
	// converted to C channels (1: grayscale, 3: RGB).
	Shape Shape
	// SkipBad skips files that cannot be decoded and class folders without
	// images, listing them in the Report, instead of failing on the first.
	SkipBad bool
	// CacheDir, when set, holds the cache file instead of the data folder.
	// By default the cache is ROOT/.cnnc-cache-HxWxC.bin, or under
	// os.UserCacheDir()/cnnc/imagefolder when ROOT is not writable.
	CacheDir string
	// NoCache decodes every image on every open and keeps them in memory.
	NoCache bool
	// Rehash reads and hashes every file on open instead of trusting an
	// unchanged size and modification time.
	Rehash bool
	// Workers is the number of decoding goroutines (default GOMAXPROCS).
	Workers int
	// Warn, when set, receives each warning as it happens (they are in the
	// Report too).
	Warn func(msg string)
	// Progress, when set, is called from one goroutine after each file is
	// processed while the cache is built.
	Progress func(done, total int)
}

// BadFile is a file that could not be used, and why.
type BadFile struct {
	Path   string
	Reason string
}

// Report tells what opening an ImageFolder found and did.
type Report struct {
	Root         string
	Classes      int
	Files        int       // image files found, bad ones included
	Decoded      int       // files decoded by this open (0 on a cache hit)
	Reused       int       // images taken from a cache file
	Skipped      []BadFile // bad files left out (SkipBad)
	EmptyClasses []string  // class folders without usable images (SkipBad)
	Ignored      []string  // files without an image extension, left out as torchvision does
	CacheFile    string    // the cache file serving the images; "" when in memory
	CacheStatus  string    // "hit", "created", "updated", "disabled" (NoCache) or "not saved: why"
	Warnings     []string
}

// FileError is a problem with one file or folder of a data set; Error
// starts with the path.
type FileError struct {
	Path string
	Err  error
}

func (e *FileError) Error() string { return e.Path + ": " + e.Err.Error() }
func (e *FileError) Unwrap() error { return e.Err }

func fileErrorf(path, format string, args ...any) error {
	return &FileError{Path: path, Err: fmt.Errorf(format, args...)}
}

// ImageFolder is a Dataset of the images under a folder.
type ImageFolder struct {
	root     string
	shape    Shape
	classes  []string
	samples  []folderSample
	pixels   io.ReaderAt // slot i at slotBase + i*shape.Size()
	slotBase int64
	closer   io.Closer
	report   Report
}

type folderSample struct {
	path  string
	label int32
	slot  int
}

// folderFile is an image file found by the scan.
type folderFile struct {
	path    string
	rel     string // slash-separated, relative to the root: the cache key
	label   int32
	size    int64
	mtime   int64
	statErr error // the file cannot be read (e.g. a dangling link)
}

// OpenImageFolder scans root, decodes what the cache does not hold (in
// parallel) and returns the data set. Without SkipBad the first bad file,
// in folder order, or empty class folder is an error naming it.
func OpenImageFolder(root string, opts ImageFolderOptions) (*ImageFolder, error) {
	if err := opts.Shape.validate(); err != nil {
		return nil, &FileError{Path: root, Err: err}
	}
	if opts.Workers <= 0 {
		opts.Workers = runtime.GOMAXPROCS(0)
	}
	o := &opener{root: root, opts: opts, report: Report{Root: root}}
	return o.open()
}

// opener carries the state of one OpenImageFolder call.
type opener struct {
	root    string
	opts    ImageFolderOptions
	report  Report
	classes []string
	files   []folderFile
}

func (o *opener) warn(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	o.report.Warnings = append(o.report.Warnings, msg)
	if o.opts.Warn != nil {
		o.opts.Warn(msg)
	}
}

func (o *opener) open() (*ImageFolder, error) {
	if err := o.scan(); err != nil {
		return nil, err
	}
	o.report.Classes, o.report.Files = len(o.classes), len(o.files)
	if n := len(o.report.Ignored); n > 0 {
		o.warn("ignored %d file(s) without an image extension, e.g. %s", n, o.report.Ignored[0])
	}
	// Empty class folders come first: they need no decoding to be found.
	perClass := make([]int, len(o.classes))
	for _, f := range o.files {
		perClass[f.label]++
	}
	for c, n := range perClass {
		if n > 0 {
			continue
		}
		dir := filepath.Join(o.root, o.classes[c])
		if !o.opts.SkipBad {
			return nil, fileErrorf(dir, "class folder %q has no images (%s); remove it, add images or use SkipBad", o.classes[c], extensionList())
		}
		o.report.EmptyClasses = append(o.report.EmptyClasses, dir)
		o.warn("%s: class folder %q has no images; its label %d will never occur", dir, o.classes[c], c)
	}
	if len(o.files) == 0 {
		return nil, fileErrorf(o.root, "no images in its %d class folder(s) (%s)", len(o.classes), extensionList())
	}

	if o.opts.NoCache {
		o.report.CacheStatus = "disabled"
		return o.build(nil, nil)
	}
	candidates := o.cachePaths()
	var old *cacheFile
	for _, path := range candidates {
		c, err := openCache(path, o.opts.Shape)
		if errors.Is(err, errNoCache) {
			continue
		}
		if err != nil {
			o.warn("%s: cache unusable (%v); rebuilding it", path, err)
			continue
		}
		reuse, exact := o.match(c)
		if exact && o.opts.Rehash {
			exact = o.sameContent(c, reuse)
		}
		if exact {
			if err := c.verifySlots(); err != nil {
				o.warn("%s: cache unusable (%v); rebuilding it", path, err)
				c.Close()
				continue
			}
			if old != nil {
				old.Close()
			}
			return o.serveCache(c, reuse)
		}
		if old == nil {
			old = c
		} else {
			c.Close()
		}
	}
	var reuse []int
	if old != nil {
		reuse, _ = o.match(old)
		defer old.Close()
	}
	return o.build(old, reuse)
}

func extensionList() string {
	exts := make([]string, 0, len(imageExtensions))
	for e := range imageExtensions {
		exts = append(exts, e)
	}
	sort.Strings(exts)
	return "files ending " + strings.Join(exts, " ")
}

// scan lists classes and image files in torchvision's order: classes are
// the sorted sub-folders of root; each class folder is walked recursively
// (following links), folders in sorted path order, files sorted by name.
func (o *opener) scan() error {
	st, err := os.Stat(o.root)
	if errors.Is(err, fs.ErrNotExist) {
		return fileErrorf(o.root, "image folder does not exist")
	}
	if err != nil {
		return &FileError{Path: o.root, Err: err}
	}
	if !st.IsDir() {
		return fileErrorf(o.root, "not a folder (an ImageFolder is ROOT/CLASS/IMAGE)")
	}
	entries, err := os.ReadDir(o.root)
	if err != nil {
		return &FileError{Path: o.root, Err: err}
	}
	for _, e := range entries { // ReadDir sorts by name
		if isDir(filepath.Join(o.root, e.Name()), e) {
			o.classes = append(o.classes, e.Name())
		}
	}
	if len(o.classes) == 0 {
		return fileErrorf(o.root, "no class folders (an ImageFolder is ROOT/CLASS/IMAGE, one sub-folder per class)")
	}
	for label, class := range o.classes {
		dirs := map[string][]string{}
		if err := o.walk(filepath.Join(o.root, class), nil, dirs); err != nil {
			return err
		}
		dirNames := make([]string, 0, len(dirs))
		for d := range dirs {
			dirNames = append(dirNames, d)
		}
		sort.Strings(dirNames) // Python sorts os.walk's (dirpath, ...) tuples
		for _, d := range dirNames {
			names := dirs[d]
			sort.Strings(names)
			for _, name := range names {
				o.addFile(filepath.Join(d, name), int32(label))
			}
		}
	}
	return nil
}

// isDir tells whether a directory entry is a folder, following links.
func isDir(path string, e fs.DirEntry) bool {
	if e.IsDir() {
		return true
	}
	if e.Type()&fs.ModeSymlink != 0 {
		st, err := os.Stat(path)
		return err == nil && st.IsDir()
	}
	return false
}

// walk collects the file names of dir and its sub-folders into dirs.
// ancestors guards against link cycles, which os.walk would follow forever.
func (o *opener) walk(dir string, ancestors []os.FileInfo, dirs map[string][]string) error {
	st, err := os.Stat(dir)
	if err != nil {
		return &FileError{Path: dir, Err: err}
	}
	for _, a := range ancestors {
		if os.SameFile(a, st) {
			o.warn("%s: link back to a parent folder, not followed", dir)
			return nil
		}
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return &FileError{Path: dir, Err: err}
	}
	names := []string{}
	for _, e := range entries {
		p := filepath.Join(dir, e.Name())
		if isDir(p, e) {
			if err := o.walk(p, append(ancestors, st), dirs); err != nil {
				return err
			}
			continue
		}
		names = append(names, e.Name())
	}
	dirs[dir] = names
	return nil
}

func (o *opener) addFile(path string, label int32) {
	if !imageExtensions[strings.ToLower(filepath.Ext(path))] {
		o.report.Ignored = append(o.report.Ignored, path)
		return
	}
	rel, _ := filepath.Rel(o.root, path)
	f := folderFile{path: path, rel: filepath.ToSlash(rel), label: label, size: -1}
	if st, err := os.Stat(path); err != nil {
		f.statErr = err
	} else {
		f.size, f.mtime = st.Size(), st.ModTime().UnixNano()
	}
	o.files = append(o.files, f)
}

// cachePaths lists where the cache may be, in order of preference.
func (o *opener) cachePaths() []string {
	s := o.opts.Shape
	if o.opts.CacheDir != "" {
		return []string{filepath.Join(o.opts.CacheDir, o.rootKey()+"-"+s.String()+".bin")}
	}
	paths := []string{filepath.Join(o.root, fmt.Sprintf(".cnnc-cache-%v.bin", s))}
	if dir, err := userCacheDir(); err == nil {
		paths = append(paths, filepath.Join(dir, "cnnc", "imagefolder", o.rootKey()+"-"+s.String()+".bin"))
	}
	return paths
}

// userCacheDir is os.UserCacheDir; tests point it at a temporary folder.
var userCacheDir = os.UserCacheDir

// rootKey names a folder's cache outside the folder: its base name for the
// reader and a hash of its absolute path for uniqueness.
func (o *opener) rootKey() string {
	abs, err := filepath.Abs(o.root)
	if err != nil {
		abs = o.root
	}
	sum := sha256.Sum256([]byte(abs))
	return filepath.Base(abs) + "-" + hex.EncodeToString(sum[:8])
}

// match maps each file to the cache entry it may reuse (-1: none). exact
// means the cache describes the folder as it is: every file matches its
// record by size and mtime and no record is left over.
func (o *opener) match(c *cacheFile) (reuse []int, exact bool) {
	reuse = make([]int, len(o.files))
	exact = len(c.entries) == len(o.files)
	for i, f := range o.files {
		j, ok := c.byRel[f.rel]
		if !ok || f.statErr != nil {
			reuse[i], exact = -1, false
			continue
		}
		reuse[i] = j
		if e := c.entries[j]; e.size != f.size || e.mtime != f.mtime {
			exact = false // still reusable if the bytes hash the same
		}
	}
	return reuse, exact
}

// sameContent hashes every file (in parallel) and tells whether all equal
// their cache records: Rehash's check of a cache whose records match.
func (o *opener) sameContent(c *cacheFile, reuse []int) bool {
	var mismatch atomic.Bool
	next := atomic.Int64{}
	var wg sync.WaitGroup
	for range min(o.opts.Workers, len(o.files)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for !mismatch.Load() {
				i := int(next.Add(1) - 1)
				if i >= len(o.files) {
					return
				}
				b, err := os.ReadFile(o.files[i].path)
				if err != nil || sha256.Sum256(b) != c.entries[reuse[i]].sha256 {
					mismatch.Store(true)
				}
			}
		}()
	}
	wg.Wait()
	return !mismatch.Load()
}

// serveCache serves an up-to-date cache.
func (o *opener) serveCache(c *cacheFile, reuse []int) (*ImageFolder, error) {
	entries := make([]cacheEntry, len(o.files))
	for i, j := range reuse {
		entries[i] = c.entries[j]
	}
	o.report.Reused = len(o.files)
	o.report.CacheFile, o.report.CacheStatus = c.path, "hit"
	ds, err := o.finish(entries, c.f, cacheHeaderSize)
	if err != nil {
		c.Close()
		return nil, err
	}
	ds.closer = c.f
	return ds, nil
}

// fileResult is what a build worker found out about one file.
type fileResult struct {
	index   int
	entry   cacheEntry
	decoded bool
	reused  bool
	err     error // a bad file: why (the entry records it too)
}

// build produces every file's image, from the old cache where it can and
// by decoding otherwise, into a new cache file (or memory).
func (o *opener) build(old *cacheFile, reuse []int) (*ImageFolder, error) {
	size := o.opts.Shape.Size()
	var (
		slots interface {
			io.ReaderAt
			io.WriterAt
		}
		writer   *cacheWriter
		slotBase int64
	)
	if !o.opts.NoCache {
		writer = o.createCache()
	}
	if writer != nil {
		slots, slotBase = writer, cacheHeaderSize
	} else {
		slots = make(memorySlots, len(o.files)*size)
	}

	jobs := make(chan int)
	results := make(chan fileResult)
	var stop atomic.Bool
	var wg sync.WaitGroup
	for range min(o.opts.Workers, len(o.files)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			img := make([]byte, size)
			for i := range jobs {
				j := -1
				if reuse != nil {
					j = reuse[i]
				}
				results <- o.produce(i, old, j, img, slots, slotBase)
			}
		}()
	}
	go func() {
		// Files are handed out in order and every handed-out file is
		// finished, so the first bad file in folder order is always found
		// even though decoding is parallel.
		for i := range o.files {
			if stop.Load() {
				break
			}
			jobs <- i
		}
		close(jobs)
		wg.Wait()
		close(results)
	}()

	entries := make([]cacheEntry, len(o.files))
	firstBad := -1
	var firstErr error
	done := 0
	for r := range results {
		entries[r.index] = r.entry
		if r.decoded {
			o.report.Decoded++
		}
		if r.reused {
			o.report.Reused++
		}
		if r.err != nil && !o.opts.SkipBad {
			stop.Store(true)
			if firstBad < 0 || r.index < firstBad {
				firstBad, firstErr = r.index, r.err
			}
		}
		done++
		if o.opts.Progress != nil {
			o.opts.Progress(done, len(o.files))
		}
	}
	if firstErr != nil {
		if writer != nil {
			writer.abandon()
		}
		return nil, firstErr
	}

	var pixels io.ReaderAt = slots
	var closer io.Closer
	switch {
	case writer != nil:
		pixels, closer = writer.f, writer.f
		if err := writer.commit(entries); err != nil {
			o.warn("%s: cannot write the cache (%v); decoding again next run", writer.path, err)
			o.report.CacheStatus = "not saved: " + err.Error()
		} else {
			o.report.CacheFile = writer.path
			if old != nil {
				o.report.CacheStatus = "updated"
			} else {
				o.report.CacheStatus = "created"
			}
		}
	case o.report.CacheStatus == "":
		o.report.CacheStatus = "not saved: no writable cache folder"
	}
	ds, err := o.finish(entries, pixels, slotBase)
	if err != nil {
		if closer != nil {
			closer.Close()
		}
		return nil, err
	}
	ds.closer = closer
	return ds, nil
}

// createCache opens the temporary file for a new cache at the first cache
// path whose folder is writable; nil when none is (the images then stay
// in memory).
func (o *opener) createCache() *cacheWriter {
	var reasons []string
	for _, path := range o.cachePaths() {
		dir := filepath.Dir(path)
		if dir != o.root {
			os.MkdirAll(dir, 0o755)
		}
		f, err := createCacheTemp(dir)
		if err != nil {
			reasons = append(reasons, err.Error())
			continue
		}
		if len(reasons) > 0 {
			o.warn("%s: cannot write the cache next to the data (%s); caching in %s", o.root, reasons[0], path)
		}
		return &cacheWriter{f: f, path: path, shape: o.opts.Shape}
	}
	o.report.CacheStatus = "not saved: " + strings.Join(reasons, "; ")
	o.warn("%s: cannot write a cache file (%s); images stay in memory and are decoded again next run", o.root, strings.Join(reasons, "; "))
	return nil
}

// produce makes file i's image in slot i: copied from the old cache's
// entry j when that still describes the file, decoded otherwise.
func (o *opener) produce(i int, old *cacheFile, j int, img []byte, slots io.WriterAt, slotBase int64) fileResult {
	f := o.files[i]
	r := fileResult{index: i, entry: cacheEntry{rel: f.rel, size: f.size, mtime: f.mtime}}
	if f.statErr != nil {
		r.err = &FileError{Path: f.path, Err: f.statErr}
		r.entry.bad = f.statErr.Error()
		return r
	}
	slotOff := slotBase + int64(i)*int64(len(img))
	if ext := strings.ToLower(filepath.Ext(f.path)); ext == ".ppm" || ext == ".pgm" {
		// torchvision reads these; saying so beats leaving them out silently.
		return o.badResult(r, errors.New("PPM/PGM images are not supported; convert them to PNG"))
	}
	var encoded []byte
	if j >= 0 {
		e := old.entries[j]
		sameStat := !o.opts.Rehash && e.size == f.size && e.mtime == f.mtime
		if !sameStat {
			var err error
			if encoded, err = os.ReadFile(f.path); err != nil {
				return o.badResult(r, err)
			}
			sameStat = sha256.Sum256(encoded) == e.sha256
		}
		if sameStat {
			r.entry.sha256, r.entry.bad, r.entry.crc = e.sha256, e.bad, e.crc
			if e.bad != "" {
				r.err = &FileError{Path: f.path, Err: errors.New(e.bad)}
				r.reused = true
				return r
			}
			if old.readSlot(j, img) == nil {
				if _, err := slots.WriteAt(img, slotOff); err != nil {
					return o.badResult(r, fmt.Errorf("writing the cache: %v", err))
				}
				r.reused = true
				return r
			}
			// A damaged slot: decode the file again.
		}
	}
	if encoded == nil {
		var err error
		if encoded, err = os.ReadFile(f.path); err != nil {
			return o.badResult(r, err)
		}
	}
	r.entry.sha256 = sha256.Sum256(encoded)
	r.decoded = true
	pix, w, h, err := decodeImage(encoded, o.opts.Shape.C)
	if err != nil {
		return o.badResult(r, err)
	}
	pix = resizeBilinear(pix, w, h, o.opts.Shape.C, o.opts.Shape.W, o.opts.Shape.H)
	r.entry.crc = crc32.Checksum(pix, crc32c)
	if _, err := slots.WriteAt(pix, slotOff); err != nil {
		return o.badResult(r, fmt.Errorf("writing the cache: %v", err))
	}
	return r
}

func (o *opener) badResult(r fileResult, err error) fileResult {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		err = pe.Err // the path is already in the FileError
	}
	r.entry.bad = err.Error()
	r.err = &FileError{Path: o.files[r.index].path, Err: err}
	return r
}

// finish builds the data set from the final entries: bad files are
// reported (only SkipBad gets here with some) and left out.
func (o *opener) finish(entries []cacheEntry, pixels io.ReaderAt, slotBase int64) (*ImageFolder, error) {
	ds := &ImageFolder{root: o.root, shape: o.opts.Shape, classes: o.classes, pixels: pixels, slotBase: slotBase}
	usable := make([]int, len(o.classes))
	for i, e := range entries {
		f := o.files[i]
		if e.bad != "" {
			if !o.opts.SkipBad {
				return nil, fileErrorf(f.path, "%s", e.bad)
			}
			o.report.Skipped = append(o.report.Skipped, BadFile{Path: f.path, Reason: e.bad})
			o.warn("skipped %s: %s", f.path, e.bad)
			continue
		}
		usable[f.label]++
		ds.samples = append(ds.samples, folderSample{path: f.path, label: f.label, slot: i})
	}
	for c, n := range usable {
		dir := filepath.Join(o.root, o.classes[c])
		if n == 0 && !slices.Contains(o.report.EmptyClasses, dir) {
			o.report.EmptyClasses = append(o.report.EmptyClasses, dir)
			o.warn("%s: class folder %q has no usable images; its label %d will never occur", dir, o.classes[c], c)
		}
	}
	if len(ds.samples) == 0 {
		return nil, fileErrorf(o.root, "no usable images: all %d image files are bad", len(entries))
	}
	ds.report = o.report
	return ds, nil
}

// Len is the number of usable images.
func (d *ImageFolder) Len() int { return len(d.samples) }

// Shape is the model's input shape the images were resized to.
func (d *ImageFolder) Shape() Shape { return d.shape }

// NumClasses is the number of class folders, empty ones included (their
// labels are kept, as torchvision keeps them).
func (d *ImageFolder) NumClasses() int { return len(d.classes) }

// Classes returns the class names in label order.
func (d *ImageFolder) Classes() []string { return slices.Clone(d.classes) }

// Label returns sample i's class.
func (d *ImageFolder) Label(i int) int32 { return d.samples[i].label }

// Path returns the file sample i was decoded from.
func (d *ImageFolder) Path(i int) string { return d.samples[i].path }

// Report tells what opening the folder found and did.
func (d *ImageFolder) Report() Report { return d.report }

// ReadImage copies sample i's pixels (HWC) to dst.
func (d *ImageFolder) ReadImage(i int, dst []uint8) error {
	if err := checkReadArgs(d, i, dst); err != nil {
		return err
	}
	off := d.slotBase + int64(d.samples[i].slot)*int64(len(dst))
	if _, err := d.pixels.ReadAt(dst, off); err != nil {
		return fmt.Errorf("%s: reading its cached image: %v", d.samples[i].path, err)
	}
	return nil
}

// Close closes the cache file.
func (d *ImageFolder) Close() error {
	if d.closer == nil {
		return nil
	}
	err := d.closer.Close()
	d.closer = nil
	return err
}
