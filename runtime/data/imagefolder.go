package data

// ImageFolder: torchvision's ROOT/CLASS/.../IMAGE layout, decoded once in
// parallel into one cache file (cache.go) and served from it.
//
// Matching the cache to the folder: each file's record is trusted by its
// key (size, mtime, change time, inode: filekey.go) when the key equals
// the file's and was not taken within racyWindow of the file's last
// change; otherwise (and for every file with Rehash) the file's bytes are
// read and their SHA-256 compared with the record's. A folder whose files
// all match, with no record left over, is served from the cache as it is
// ("hit"); otherwise a new cache is built, reusing the pixels of every
// record that still matches.

import (
	"crypto/sha256"
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
	"time"

	"github.com/cnnc/cnnc/runtime/regularfile"
)

// ImageFolderOptions configure OpenImageFolder.
type ImageFolderOptions struct {
	// Shape is the model's input: every image is resized to H x W and
	// converted to C channels (1: grayscale, 3: RGB).
	Shape Shape
	// SkipBad skips files that cannot be used (undecodable, unreadable,
	// not regular files) and class folders without images, listing them in
	// the Report, instead of failing on the first.
	SkipBad bool
	// CacheDir holds the cache file. By default it is
	// os.UserCacheDir()/cnnc/imagefolder; never the data folder.
	CacheDir string
	// NoCache decodes every image on every open and keeps them in memory.
	NoCache bool
	// Rehash reads and hashes every file on open instead of trusting an
	// unchanged key (size, mtime, change time, inode).
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
	Reused       int       // images (or verdicts on bad files) taken from a cache file
	Hashed       int       // files read and hashed to check the cache's record of them
	Skipped      []BadFile // bad files left out (SkipBad)
	EmptyClasses []string  // class folders without usable images (SkipBad)
	Ignored      []string  // files without an image extension, left out as torchvision does
	CacheFile    string    // the cache file serving the images; "" when in memory
	CacheStatus  string    // "hit", "created", "updated", "disabled" (NoCache) or "not saved: why"
	Warnings     []string
}

// FileError is a problem with one file or folder of a data set; Error
// starts with the path. Skippable errors are those SkipBad skips; Hint,
// when set, says what the user can do and follows the reason.
type FileError struct {
	Path      string
	Err       error
	Skippable bool
	Hint      string
}

func (e *FileError) Error() string {
	if e.Hint != "" {
		return e.Path + ": " + e.Err.Error() + "; " + e.Hint
	}
	return e.Path + ": " + e.Err.Error()
}

func (e *FileError) Unwrap() error { return e.Err }

func fileErrorf(path, format string, args ...any) error {
	return &FileError{Path: path, Err: fmt.Errorf(format, args...)}
}

// skipHint is what a user can do about a bad file or an empty class.
const skipHint = "remove or replace it, or skip bad images (--skip-bad)"

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
	key     fileKey
	statErr error // the file cannot be read (a dangling link, not a regular file)
	hashed  bool  // sha256 holds the hash of its bytes, read under key
	sha256  [sha256.Size]byte
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
	o := &opener{root: root, opts: opts, report: Report{Root: root}, gate: newMemoryGate(maxDecodeBytes)}
	return o.open()
}

// opener carries the state of one OpenImageFolder call.
type opener struct {
	root     string
	opts     ImageFolderOptions
	report   Report
	classes  []string
	files    []folderFile
	resolved string // root's resolved absolute path
	scanTime time.Time
	gate     *memoryGate
}

func (o *opener) warn(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	o.report.Warnings = append(o.report.Warnings, msg)
	if o.opts.Warn != nil {
		o.opts.Warn(msg)
	}
}

func (o *opener) open() (*ImageFolder, error) {
	o.scanTime = time.Now()
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
			return nil, &FileError{Path: dir, Err: fmt.Errorf("class folder %q has no images (%s)", o.classes[c], extensionList()), Skippable: true,
				Hint: "add images, remove the folder, or skip bad images and empty classes (--skip-bad)"}
		}
		o.report.EmptyClasses = append(o.report.EmptyClasses, dir)
		o.warn("%s: class folder %q has no images; its label %d will never occur", dir, o.classes[c], c)
	}
	if len(o.files) == 0 {
		return nil, fileErrorf(o.root, "no images in its %d class folder(s) (%s)", len(o.classes), extensionList())
	}

	if o.opts.NoCache {
		o.report.CacheStatus = "disabled"
		return o.build(nil, nil, "")
	}
	path, err := o.cachePath()
	if err != nil {
		o.report.CacheStatus = "not saved: " + err.Error()
		o.warn("%s: no cache folder (%v); images stay in memory and are decoded again next run", o.root, err)
		return o.build(nil, nil, "")
	}
	old, err := openCache(path, o.opts.Shape, o.resolved)
	switch {
	case errors.Is(err, errNoCache):
		return o.build(nil, nil, path)
	case err != nil:
		o.warn("%v; rebuilding it", err)
		return o.build(nil, nil, path)
	}
	defer func() {
		if old != nil {
			old.Close()
		}
	}()
	reuse, exact := o.match(old)
	if exact {
		if err := old.verifySlots(); err != nil {
			o.warn("%s: cache unusable (%v); rebuilding it", path, err)
			return o.build(nil, nil, path)
		}
		ds, err := o.serveCache(old, reuse)
		old = nil // ds holds it now (or serveCache closed it)
		return ds, err
	}
	return o.build(old, reuse, path)
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
	if o.resolved, err = filepath.Abs(o.root); err == nil {
		if r, err := filepath.EvalSymlinks(o.resolved); err == nil {
			o.resolved = r
		}
	}
	entries, err := os.ReadDir(o.root)
	if err != nil {
		return &FileError{Path: o.root, Err: err}
	}
	for _, e := range entries { // ReadDir sorts by name
		if isDir(filepath.Join(o.root, e.Name()), e) {
			o.classes = append(o.classes, e.Name())
		} else if strings.HasPrefix(e.Name(), ".cnnc-cache-") && strings.HasSuffix(e.Name(), ".bin") {
			o.warn("%s: an image cache left in the data folder by an older cnnc; caches are kept in the user's cache folder now, so delete it", filepath.Join(o.root, e.Name()))
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

// addFile records an image file and its key. A file that is not a
// regular file (a FIFO, a link to a device) is bad, by name, and is never
// opened.
func (o *opener) addFile(path string, label int32) {
	if !imageExtensions[strings.ToLower(filepath.Ext(path))] {
		o.report.Ignored = append(o.report.Ignored, path)
		return
	}
	rel, _ := filepath.Rel(o.root, path)
	f := folderFile{path: path, rel: filepath.ToSlash(rel), label: label}
	if st, err := regularfile.Stat(path); err != nil {
		f.statErr = err
	} else {
		f.key = keyOf(st)
	}
	o.files = append(o.files, f)
}

// cachePath is where the folder's cache for the shape lives.
func (o *opener) cachePath() (string, error) {
	dir := o.opts.CacheDir
	if dir == "" {
		d, err := userCacheDir()
		if err != nil {
			return "", err
		}
		dir = filepath.Join(d, "cnnc", "imagefolder")
	}
	return filepath.Join(dir, cacheName(o.resolved, o.opts.Shape)), nil
}

// userCacheDir is os.UserCacheDir; tests point it at a temporary folder.
var userCacheDir = os.UserCacheDir

// readImageFile reads an image file; tests make it fail as a file without
// read permission does (root reads those).
var readImageFile = regularfile.ReadAll

// trusted tells whether a record may stand for file f without reading it.
func (o *opener) trusted(c *cacheFile, e cacheEntry, f folderFile) bool {
	return keyHasCtime && !o.opts.Rehash && f.statErr == nil && e.state != stateNotRead &&
		e.key == f.key && e.key.ctime < c.scanTime-int64(racyWindow)
}

// match maps each file to the cache record it may reuse (-1: none),
// hashing the files whose records cannot be trusted by their key. exact
// means the cache describes the folder as it is: every file matches its
// record (files that cannot be read at all are refused afresh by the scan
// on every open) and no record is left over.
func (o *opener) match(c *cacheFile) (reuse []int, exact bool) {
	reuse = make([]int, len(o.files))
	exact = len(c.entries) == len(o.files)
	var check []int
	for i, f := range o.files {
		j, ok := c.byRel[f.rel]
		if !ok {
			reuse[i], exact = -1, false
			continue
		}
		reuse[i] = j
		e := c.entries[j]
		switch {
		case f.statErr != nil:
			exact = exact && e.state == stateNotRead
		case e.state == stateNotRead:
			exact = false // try it again
		case unsupportedByName(f.path) != nil:
			exact = exact && e.state == stateBad
		case !o.trusted(c, e, f):
			check = append(check, i)
		}
	}
	if !exact {
		// build hashes what it needs, file by file, as it decodes
		return reuse, false
	}
	o.hashFiles(check)
	for _, i := range check {
		f, e := o.files[i], c.entries[reuse[i]]
		exact = exact && f.hashed && f.sha256 == e.sha256 && f.key == e.key
	}
	return reuse, exact
}

// hashFiles reads and hashes the listed files in parallel. A file that
// cannot be read is left unhashed (building the cache reports it).
func (o *opener) hashFiles(list []int) {
	next := atomic.Int64{}
	var wg sync.WaitGroup
	for range min(o.opts.Workers, len(list)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				k := int(next.Add(1) - 1)
				if k >= len(list) {
					return
				}
				o.hashFile(&o.files[list[k]]) // a failure leaves it unhashed
			}
		}()
	}
	wg.Wait()
	o.report.Hashed += len(list)
}

// hashFile reads f and records its hash and the key it was read under.
// Only a regular file of at most maxImageFileBytes is read.
func (o *opener) hashFile(f *folderFile) ([]byte, error) {
	b, info, err := readImage(f.path)
	if err != nil {
		return nil, err
	}
	f.key, f.sha256, f.hashed = keyOf(info), sha256.Sum256(b), true
	return b, nil
}

// readImage reads an image file: a regular file of at most
// maxImageFileBytes.
func readImage(path string) ([]byte, fs.FileInfo, error) {
	b, info, err := readImageFile(path, maxImageFileBytes)
	var tl *regularfile.TooLargeError
	if errors.As(err, &tl) {
		err = fmt.Errorf("image file of %d MiB is larger than the %d MiB an image file may be", tl.Size>>20, tl.Max>>20)
	}
	return b, info, err
}

// serveCache serves an up-to-date cache.
func (o *opener) serveCache(c *cacheFile, reuse []int) (*ImageFolder, error) {
	entries := make([]cacheEntry, len(o.files))
	for i, j := range reuse {
		entries[i] = c.entries[j]
		if err := o.files[i].statErr; err != nil {
			entries[i].reason = reasonOf(err)
		}
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

// reasonOf is an error's text without the path a *fs.PathError adds (the
// reason is reported next to the path anyway).
func reasonOf(err error) string {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		err = pe.Err
	}
	return err.Error()
}

// fileResult is what a build worker found out about one file.
type fileResult struct {
	index    int
	entry    cacheEntry
	decoded  bool
	reused   bool
	hashed   bool
	err      error // a bad file: why (the entry records it too)
	cacheErr error // writing the cache failed: the build stops
}

// build produces every file's image, from the old cache where it can and
// by decoding otherwise, into a new cache file at path (or memory when
// path is "" or cannot be written).
func (o *opener) build(old *cacheFile, reuse []int, path string) (*ImageFolder, error) {
	size := o.opts.Shape.Size()
	var (
		slots interface {
			io.ReaderAt
			io.WriterAt
		}
		writer   *cacheWriter
		slotBase int64
	)
	if path != "" {
		writer = o.createCache(path)
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
	var firstErr, cacheErr error
	done := 0
	for r := range results {
		entries[r.index] = r.entry
		if r.decoded {
			o.report.Decoded++
		}
		if r.reused {
			o.report.Reused++
		}
		if r.hashed {
			o.report.Hashed++
		}
		if r.cacheErr != nil && cacheErr == nil {
			stop.Store(true)
			cacheErr = r.cacheErr
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
	if cacheErr != nil || firstErr != nil {
		if writer != nil {
			writer.abandon()
		}
		if cacheErr != nil {
			return nil, &FileError{Path: writer.path, Err: fmt.Errorf("writing the image cache: %v", cacheErr), Hint: "free space there or choose another cache folder (--cache-dir)"}
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

// createCache opens the temporary file for a new cache at path; nil when
// its folder cannot be written or has no room for it (the images then stay
// in memory).
func (o *opener) createCache(path string) *cacheWriter {
	dir := filepath.Dir(path)
	need := cacheHeaderSize + int64(len(o.files))*int64(o.opts.Shape.Size())
	var reason string
	if err := os.MkdirAll(dir, 0o755); err != nil {
		reason = err.Error()
	} else if free, ok := freeBytes(dir); ok && free < need {
		reason = fmt.Sprintf("it needs %d MiB, %d MiB are free there", need>>20, free>>20)
	} else if f, err := createCacheTemp(dir); err != nil {
		reason = err.Error()
	} else {
		return &cacheWriter{f: f, path: path, shape: o.opts.Shape, root: o.resolved, scanTime: o.scanTime.UnixNano()}
	}
	o.report.CacheStatus = "not saved: " + reason
	o.warn("%s: cannot write the image cache in %s (%s); the images (%d MiB) stay in memory and are decoded again next run; choose a cache folder with room (--cache-dir)", o.root, dir, reason, need>>20)
	return nil
}

// produce makes file i's image in slot i: copied from the old cache's
// record j when that still describes the file, decoded otherwise. Only
// what the file's fully read bytes decide is recorded as bad; a file that
// could not be read is recorded as not read, to be tried again.
func (o *opener) produce(i int, old *cacheFile, j int, img []byte, slots io.WriterAt, slotBase int64) fileResult {
	f := &o.files[i]
	r := fileResult{index: i, entry: cacheEntry{rel: f.rel, key: f.key}}
	if f.statErr != nil {
		return o.notRead(r, f.statErr)
	}
	slotOff := slotBase + int64(i)*int64(len(img))
	if err := unsupportedByName(f.path); err != nil {
		return o.bad(r, err) // the verdict depends on the name alone: it is kept
	}
	var e cacheEntry
	if j >= 0 {
		e = old.entries[j]
		if e.state == stateNotRead {
			j = -1
		}
	}
	var encoded []byte
	if j >= 0 && !o.trusted(old, e, *f) && !f.hashed {
		var err error
		if encoded, err = o.hashFile(f); err != nil {
			return o.notRead(r, err)
		}
		r.hashed = true
	}
	if j >= 0 && (o.trusted(old, e, *f) || f.sha256 == e.sha256) {
		r.entry.key, r.entry.sha256, r.entry.state, r.entry.reason, r.entry.crc = f.key, e.sha256, e.state, e.reason, e.crc
		if e.state == stateBad {
			r.err = o.badFileError(f.path, errors.New(e.reason))
			r.reused = true
			return r
		}
		if old.readSlot(j, img) == nil {
			if _, err := slots.WriteAt(img, slotOff); err != nil {
				r.cacheErr = err
				return r
			}
			r.reused = true
			return r
		}
		// A damaged slot: decode the file again.
	}
	if encoded == nil {
		var err error
		if encoded, err = o.hashFile(f); err != nil {
			return o.notRead(r, err)
		}
	}
	r.entry.key, r.entry.sha256 = f.key, f.sha256
	r.decoded = true
	plan, err := inspectImage(encoded, o.opts.Shape, maxDecodeBytes)
	if err != nil {
		return o.bad(r, err)
	}
	held := o.gate.acquire(plan.cost + int64(len(encoded)))
	pix, err := plan.decodeResized(encoded, o.opts.Shape)
	o.gate.release(held)
	if err != nil {
		return o.bad(r, err)
	}
	r.entry.crc = crc32.Checksum(pix, crc32c)
	if _, err := slots.WriteAt(pix, slotOff); err != nil {
		r.cacheErr = err
	}
	return r
}

// unsupportedByName refuses files that torchvision reads but we have no
// decoder for: saying so beats leaving them out silently.
func unsupportedByName(path string) error {
	if ext := strings.ToLower(filepath.Ext(path)); ext == ".ppm" || ext == ".pgm" {
		return errors.New("PPM/PGM images are not supported (convert them to PNG)")
	}
	return nil
}

// bad records a verdict on the file's content, kept in the cache.
func (o *opener) bad(r fileResult, err error) fileResult {
	r.entry.state, r.entry.reason = stateBad, reasonOf(err)
	r.err = o.badFileError(o.files[r.index].path, err)
	return r
}

// notRead records a failure to read the file: not kept as a verdict.
func (o *opener) notRead(r fileResult, err error) fileResult {
	r.entry.state, r.entry.reason, r.entry.sha256 = stateNotRead, reasonOf(err), [sha256.Size]byte{}
	r.err = o.badFileError(o.files[r.index].path, err)
	return r
}

func (o *opener) badFileError(path string, err error) error {
	return &FileError{Path: path, Err: errors.New(reasonOf(err)), Skippable: true, Hint: skipHint}
}

// finish builds the data set from the final entries: bad files are
// reported (only SkipBad gets here with some) and left out.
func (o *opener) finish(entries []cacheEntry, pixels io.ReaderAt, slotBase int64) (*ImageFolder, error) {
	ds := &ImageFolder{root: o.root, shape: o.opts.Shape, classes: o.classes, pixels: pixels, slotBase: slotBase}
	usable := make([]int, len(o.classes))
	for i, e := range entries {
		f := o.files[i]
		if e.state != stateDecoded {
			if !o.opts.SkipBad {
				return nil, o.badFileError(f.path, errors.New(e.reason))
			}
			o.report.Skipped = append(o.report.Skipped, BadFile{Path: f.path, Reason: e.reason})
			o.warn("skipped %s: %s", f.path, e.reason)
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
