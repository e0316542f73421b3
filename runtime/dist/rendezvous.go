package dist

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"
)

// The wire format, between the ranks of one build of cnnc: a hello from each rank, rank 0's
// answer (status, then the id or why not), then single-byte notices until the end.
const (
	helloMagic   = "CNNCDIST"
	wireVersion  = 1
	hostBytes    = 64
	maxAnswer    = 64 << 10
	noticeBye    = 'B' // a clean goodbye: the sender is done
	noticeFailed = 'F' // the job failed (from rank 0), or the sender did (to rank 0); a length and the reason follow
)

type hello struct {
	Magic     [8]byte
	Version   uint32
	WorldSize uint32
	Rank      uint32
	Pid       uint32
	Host      [hostBytes]byte
}

// who names a rank's process in messages.
func (h *hello) who() string {
	host := strings.TrimRight(string(h.Host[:]), "\x00")
	return fmt.Sprintf("rank %d (%s, pid %d)", h.Rank, host, h.Pid)
}

// verdictGrace is how much longer than rank 0 the other ranks wait for the rendezvous to
// end, so that they hear rank 0 say which ranks did not come rather than time out themselves.
const verdictGrace = 5 * time.Second

// keepAlive makes a dead peer's machine (not just its process, whose end closes its
// connections at once) noticed in about 30 s.
var keepAlive = net.KeepAliveConfig{Enable: true, Idle: 15 * time.Second, Interval: 5 * time.Second, Count: 3}

// Session is a rank's membership in a job, from Rendezvous to Close.
type Session struct {
	Config Config
	// ID is what rank 0's newID made, the same on every rank (NCCL's unique id).
	ID []byte

	done     chan struct{}
	mu       sync.Mutex
	err      error
	closing  bool
	peers    []net.Conn // rank 0: peers[r] for r >= 1; others: peers[0] is rank 0
	names    []string   // rank 0: who each peer is
	leftOK   []bool     // rank 0: the peers that said goodbye
	writeMu  sync.Mutex
	monitors sync.WaitGroup
}

// Done is closed when the job has failed: a rank died (its connection closed without a
// goodbye), or rank 0 said the job failed. Err says which rank.
func (s *Session) Done() <-chan struct{} { return s.done }

// Err is why Done was closed, or nil.
func (s *Session) Err() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.err
}

// Rendezvous brings the cfg.WorldSize ranks together at cfg.Addr() and returns, on every rank,
// the bytes rank 0's newID made (called on rank 0 only, before anyone joins). Every wait —
// for rank 0 to listen, for all ranks to join, for the answer — ends after timeout (or with
// ctx) with an error naming the ranks missing or the address. The Session then watches the
// other ranks until Close.
func Rendezvous(ctx context.Context, cfg Config, newID func() ([]byte, error), timeout time.Duration) (*Session, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	s := &Session{Config: cfg, done: make(chan struct{})}
	if cfg.Rank == 0 {
		id, err := newID()
		if err != nil {
			return nil, fmt.Errorf("rank 0: making the id to share: %w", err)
		}
		if len(id) > maxAnswer {
			return nil, fmt.Errorf("rank 0: an id of %d bytes is too long to share (at most %d)", len(id), maxAnswer)
		}
		s.ID = id
		if cfg.WorldSize == 1 {
			return s, nil
		}
		return s, s.host(ctx, timeout)
	}
	return s, s.join(ctx, timeout)
}

// listenAddr is where rank 0 listens: MASTER_ADDR itself when it is a loopback address (a job
// on one machine stays off the network), else every interface (MASTER_ADDR is how the other
// nodes reach this one, which may not be an address of its own, e.g. behind NAT).
func listenAddr(cfg Config) string {
	host := cfg.MasterAddr
	if ip := net.ParseIP(host); host == "localhost" || ip != nil && ip.IsLoopback() {
		return cfg.Addr()
	}
	return net.JoinHostPort("", strconv.Itoa(cfg.MasterPort))
}

// host is rank 0's side.
func (s *Session) host(ctx context.Context, timeout time.Duration) error {
	cfg := s.Config
	ln, err := (&net.ListenConfig{KeepAliveConfig: keepAlive}).Listen(ctx, "tcp", listenAddr(cfg))
	if err != nil {
		return fmt.Errorf("rank 0: cannot listen for the other ranks at %s: %w (is another job using %s=%d?)", listenAddr(cfg), err, EnvMasterPort, cfg.MasterPort)
	}
	defer ln.Close()
	stop := context.AfterFunc(ctx, func() { ln.Close() })
	defer stop()
	deadline := time.Now().Add(timeout)
	ln.(*net.TCPListener).SetDeadline(deadline)

	type arrival struct {
		conn net.Conn
		h    hello
		err  error
	}
	arrivals := make(chan arrival)
	quit := make(chan struct{})
	defer close(quit)
	deliver := func(a arrival) {
		select {
		case arrivals <- a:
		case <-quit: // the rendezvous is over: too late to join
			if a.conn != nil {
				a.conn.Close()
			}
		}
	}
	go func() { // accept, and read each hello in its own goroutine: a slow client blocks no one
		for {
			c, err := ln.Accept()
			if err != nil {
				deliver(arrival{err: err})
				return
			}
			go func() {
				var h hello
				c.SetDeadline(deadline)
				err := binary.Read(c, binary.LittleEndian, &h)
				deliver(arrival{conn: c, h: h, err: err})
			}()
		}
	}()
	s.peers = make([]net.Conn, cfg.WorldSize)
	s.names = make([]string, cfg.WorldSize)
	s.leftOK = make([]bool, cfg.WorldSize)
	var joined []net.Conn
	fatal := func(err error) error {
		for _, c := range joined {
			c.SetDeadline(time.Now().Add(5 * time.Second))
			writeAnswer(c, 1, []byte(err.Error()))
			c.Close()
		}
		return err
	}
	for n := 1; n < cfg.WorldSize; {
		a := <-arrivals
		if a.conn == nil { // the listener stopped: timeout or ctx
			if ctx.Err() != nil {
				return fatal(fmt.Errorf("rank 0: rendezvous at %s: %w", cfg.Addr(), ctx.Err()))
			}
			return fatal(fmt.Errorf("rank 0: rendezvous at %s: %s did not join within %v (are they started, with %s and %s of this address?)",
				cfg.Addr(), s.missing(), timeout, EnvMasterAddr, EnvMasterPort))
		}
		if a.err != nil || string(a.h.Magic[:]) != helloMagic {
			a.conn.Close() // not a rank of cnnc (a port scanner, another program): ignore it
			continue
		}
		joined = append(joined, a.conn)
		h := a.h
		switch {
		case h.Version != wireVersion:
			return fatal(fmt.Errorf("rendezvous at %s: %s speaks version %d of the rendezvous, rank 0 version %d: build every rank with the same cnnc", cfg.Addr(), h.who(), h.Version, wireVersion))
		case int(h.WorldSize) != cfg.WorldSize:
			return fatal(fmt.Errorf("rendezvous at %s: %s says %s=%d, rank 0 has %d", cfg.Addr(), h.who(), EnvWorldSize, h.WorldSize, cfg.WorldSize))
		case h.Rank == 0:
			return fatal(fmt.Errorf("rendezvous at %s: %s also claims rank 0", cfg.Addr(), h.who()))
		case int(h.Rank) >= cfg.WorldSize:
			return fatal(fmt.Errorf("rendezvous at %s: %s: %s=%d is not in [0, %d)", cfg.Addr(), h.who(), EnvRank, h.Rank, cfg.WorldSize))
		case s.peers[h.Rank] != nil:
			return fatal(fmt.Errorf("rendezvous at %s: %s and %s both claim rank %d", cfg.Addr(), s.names[h.Rank], h.who(), h.Rank))
		}
		s.peers[h.Rank], s.names[h.Rank] = a.conn, h.who()
		n++
	}
	ln.Close() // no one else may join
	for r := 1; r < cfg.WorldSize; r++ {
		c := s.peers[r]
		c.SetDeadline(time.Now().Add(timeout))
		if err := writeAnswer(c, 0, s.ID); err != nil {
			for _, c := range s.peers[1:] {
				c.Close()
			}
			return fmt.Errorf("rank 0: handing the id to %s: %w", s.names[r], err)
		}
		c.SetDeadline(time.Time{})
	}
	for r := 1; r < cfg.WorldSize; r++ {
		s.monitors.Add(1)
		go s.watchPeer(r)
	}
	return nil
}

// missing lists the ranks that have not joined: "ranks 2, 3 of 4".
func (s *Session) missing() string {
	var m []string
	for r := 1; r < len(s.peers); r++ {
		if s.peers[r] == nil {
			m = append(m, strconv.Itoa(r))
		}
	}
	word := "ranks"
	if len(m) == 1 {
		word = "rank"
	}
	return fmt.Sprintf("%s %s of %d", word, strings.Join(m, ", "), len(s.peers))
}

func writeAnswer(c net.Conn, status uint32, payload []byte) error {
	b := binary.LittleEndian.AppendUint32(nil, status)
	b = binary.LittleEndian.AppendUint32(b, uint32(len(payload)))
	_, err := c.Write(append(b, payload...))
	return err
}

// join is the side of every rank but 0.
func (s *Session) join(ctx context.Context, timeout time.Duration) error {
	cfg := s.Config
	deadline := time.Now().Add(timeout)
	conn, err := dialUntil(ctx, cfg.Addr(), deadline)
	if err != nil {
		if ctx.Err() != nil {
			return fmt.Errorf("rank %d: reaching rank 0 at %s: %w", cfg.Rank, cfg.Addr(), ctx.Err())
		}
		return fmt.Errorf("rank %d: cannot reach rank 0 at %s within %v: %w (is rank 0 running? every rank needs the same %s and %s)",
			cfg.Rank, cfg.Addr(), timeout, err, EnvMasterAddr, EnvMasterPort)
	}
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	defer stop()
	host, _ := os.Hostname()
	h := hello{Version: wireVersion, WorldSize: uint32(cfg.WorldSize), Rank: uint32(cfg.Rank), Pid: uint32(os.Getpid())}
	copy(h.Magic[:], helloMagic)
	copy(h.Host[:hostBytes-1], host)
	// rank 0 decides who did not join, by the same timeout: wait a little longer, to hear it
	conn.SetDeadline(deadline.Add(verdictGrace))
	var head [8]byte
	err = binary.Write(conn, binary.LittleEndian, &h)
	if err == nil {
		_, err = io.ReadFull(conn, head[:])
	}
	status, n := binary.LittleEndian.Uint32(head[:]), binary.LittleEndian.Uint32(head[4:])
	if err == nil && n > maxAnswer {
		err = fmt.Errorf("an answer of %d bytes (at most %d): not a cnnc rank 0", n, maxAnswer)
	}
	var payload []byte
	if err == nil {
		payload = make([]byte, n)
		_, err = io.ReadFull(conn, payload)
	}
	if err != nil {
		conn.Close()
		switch {
		case ctx.Err() != nil:
			err = ctx.Err()
		case errors.Is(err, os.ErrDeadlineExceeded):
			err = fmt.Errorf("no answer within %v (rank 0 waits until every rank has joined)", timeout+verdictGrace)
		}
		return fmt.Errorf("rank %d: rendezvous with rank 0 at %s: %w", cfg.Rank, cfg.Addr(), err)
	}
	if status != 0 {
		conn.Close()
		return fmt.Errorf("rank %d: rank 0 at %s stopped the job: %s", cfg.Rank, cfg.Addr(), payload)
	}
	conn.SetDeadline(time.Time{})
	s.ID = payload
	s.peers = []net.Conn{conn}
	s.monitors.Add(1)
	go s.watchRoot()
	return nil
}

// dialUntil connects to addr, retrying while rank 0 is not listening yet.
func dialUntil(ctx context.Context, addr string, deadline time.Time) (net.Conn, error) {
	pause := 50 * time.Millisecond
	for {
		d := net.Dialer{Deadline: deadline, KeepAliveConfig: keepAlive}
		c, err := d.DialContext(ctx, "tcp", addr)
		if err == nil {
			return c, nil
		}
		if ctx.Err() != nil || time.Now().Add(pause).After(deadline) {
			return nil, err
		}
		select {
		case <-ctx.Done():
			return nil, err
		case <-time.After(pause):
		}
		pause = min(2*pause, time.Second)
	}
}

// failed records the job's failure once and closes Done; during Close nothing is a failure.
func (s *Session) failed(err error) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closing || s.err != nil {
		return false
	}
	s.err = err
	close(s.done)
	return true
}

func (s *Session) isClosing() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.closing
}

// watchPeer is rank 0 listening to rank r until it says goodbye or is gone.
func (s *Session) watchPeer(r int) {
	defer s.monitors.Done()
	var b [1]byte
	_, err := io.ReadFull(s.peers[r], b[:])
	if err == nil && b[0] == noticeBye {
		s.mu.Lock()
		s.leftOK[r] = true
		s.mu.Unlock()
		return
	}
	if s.isClosing() {
		return
	}
	why := fmt.Sprintf("%s is gone: its connection to rank 0 closed without a goodbye (it died or was killed)", s.names[r])
	if err == nil && b[0] == noticeFailed {
		why = fmt.Sprintf("%s failed", s.names[r])
		if text, ok := readReason(s.peers[r]); ok {
			why += ": " + text
		}
	} else if err == nil {
		why = fmt.Sprintf("%s sent %q: not a cnnc rank", s.names[r], b[0])
	}
	if s.failed(errors.New(why)) {
		s.tellOthers(r, why)
	}
}

// tellOthers is rank 0 telling every rank but r (and those gone) that the job failed.
func (s *Session) tellOthers(r int, why string) {
	msg := failedNotice(why)
	s.writeMu.Lock()
	defer s.writeMu.Unlock()
	for k := 1; k < len(s.peers); k++ {
		s.mu.Lock()
		skip := k == r || s.leftOK[k]
		s.mu.Unlock()
		if !skip {
			s.peers[k].SetWriteDeadline(time.Now().Add(5 * time.Second))
			s.peers[k].Write(msg)
		}
	}
}

// watchRoot is a rank listening to rank 0 until it says goodbye, says the job failed, or is
// gone.
func (s *Session) watchRoot() {
	defer s.monitors.Done()
	c := s.peers[0]
	var b [5]byte
	_, err := io.ReadFull(c, b[:1])
	if err == nil && b[0] == noticeBye {
		return
	}
	if s.isClosing() {
		return
	}
	why := fmt.Sprintf("rank 0 (at %s) is gone: its connection closed without a goodbye (it died or was killed)", s.Config.Addr())
	if err == nil && b[0] == noticeFailed {
		why = fmt.Sprintf("rank 0 (at %s) stopped the job", s.Config.Addr())
		if text, ok := readReason(c); ok {
			why = text
		}
	} else if err == nil {
		why = fmt.Sprintf("rank 0 (at %s) sent %q: not a cnnc rank 0", s.Config.Addr(), b[0])
	}
	s.failed(errors.New(why))
}

// readReason reads the length and text that follow a noticeFailed.
func readReason(c net.Conn) (string, bool) {
	var n [4]byte
	if _, err := io.ReadFull(c, n[:]); err != nil {
		return "", false
	}
	size := binary.LittleEndian.Uint32(n[:])
	if size > maxAnswer {
		return "", false
	}
	text := make([]byte, size)
	if _, err := io.ReadFull(c, text); err != nil {
		return "", false
	}
	return string(text), true
}

// failedNotice is a noticeFailed with its reason (cut to maxAnswer bytes).
func failedNotice(why string) []byte {
	if len(why) > maxAnswer {
		why = why[:maxAnswer]
	}
	msg := binary.LittleEndian.AppendUint32([]byte{noticeFailed}, uint32(len(why)))
	return append(msg, why...)
}

// Fail ends the session of a rank that stops with an error of its own while the others
// would go on: instead of Close's goodbye, which says the rank is done, it tells the job that
// it failed and why — rank 0 tells every other rank, another rank tells rank 0, which tells
// the rest — so that every other rank's Done closes, naming this rank (their collectives
// would otherwise wait for it forever). Then it closes the connections. After Close, or a
// second time, it does nothing.
func (s *Session) Fail(why error) error {
	s.mu.Lock()
	if s.closing {
		s.mu.Unlock()
		return nil
	}
	s.closing = true
	s.mu.Unlock()
	text := why.Error()
	if s.Config.Rank == 0 {
		s.tellOthers(0, fmt.Sprintf("rank 0 (at %s) failed: %s", s.Config.Addr(), text))
	} else if len(s.peers) > 0 {
		s.writeMu.Lock()
		s.peers[0].SetWriteDeadline(time.Now().Add(5 * time.Second))
		s.peers[0].Write(failedNotice(text))
		s.writeMu.Unlock()
	}
	for _, c := range s.peers {
		if c != nil {
			c.Close()
		}
	}
	s.monitors.Wait()
	return nil
}

// Close ends the session: a goodbye to the ranks it is connected to (so that they do not take
// its end for a death), then the connections. Call it when the rank is done, failed or not.
func (s *Session) Close() error {
	s.mu.Lock()
	if s.closing {
		s.mu.Unlock()
		return nil
	}
	s.closing = true
	s.mu.Unlock()
	s.writeMu.Lock()
	for _, c := range s.peers {
		if c != nil {
			c.SetWriteDeadline(time.Now().Add(5 * time.Second))
			c.Write([]byte{noticeBye})
		}
	}
	s.writeMu.Unlock()
	for _, c := range s.peers {
		if c != nil {
			c.Close()
		}
	}
	s.monitors.Wait()
	return nil
}
