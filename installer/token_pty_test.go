//go:build linux

package installer

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"github.com/fluksio/fluksio-worker/agent/config"
)

// openPTY opens a pseudo-terminal pair with nothing but the kernel's
// interface (/dev/ptmx), so the test needs no pty library.
func openPTY(t *testing.T) (master, tty *os.File) {
	t.Helper()
	master, err := os.OpenFile("/dev/ptmx", os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		t.Skipf("no pseudo-terminals here: %v", err)
	}
	t.Cleanup(func() { master.Close() })
	var unlock int32
	if err := ioctl(master, syscall.TIOCSPTLCK, unsafe.Pointer(&unlock)); err != nil {
		t.Fatalf("unlocking the pty: %v", err)
	}
	var n uint32
	if err := ioctl(master, syscall.TIOCGPTN, unsafe.Pointer(&n)); err != nil {
		t.Fatalf("numbering the pty: %v", err)
	}
	tty, err = os.OpenFile(fmt.Sprintf("/dev/pts/%d", n), os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tty.Close() })
	return master, tty
}

func ioctl(f *os.File, req uintptr, arg unsafe.Pointer) error {
	raw, err := f.SyscallConn()
	if err != nil {
		return err
	}
	var errno syscall.Errno
	raw.Control(func(fd uintptr) {
		_, _, errno = syscall.Syscall(syscall.SYS_IOCTL, fd, req, uintptr(arg))
	})
	if errno != 0 {
		return errno
	}
	return nil
}

func echoOn(t *testing.T, tty *os.File) bool {
	t.Helper()
	var tio syscall.Termios
	if err := ioctl(tty, syscall.TCGETS, unsafe.Pointer(&tio)); err != nil {
		t.Fatal(err)
	}
	return tio.Lflag&syscall.ECHO != 0
}

// `install --token -` at a terminal asks for the token and does not echo
// what is pasted; the terminal is left as it was.
func TestTokenAtATerminalIsNotEchoed(t *testing.T) {
	master, tty := openPTY(t)
	if !echoOn(t, tty) {
		t.Fatal("a fresh terminal does not echo; the test cannot tell")
	}
	const secret = "pty-secret-5e1b"
	type result struct {
		tok string
		err error
	}
	got := make(chan result, 1)
	go func() {
		tok, err := config.ReadTokenFrom(tty)
		got <- result{tok, err}
	}()
	// Paste only once echo is off, as a person would after the prompt;
	// if it never goes off, paste anyway and let the echo show.
	deadline := time.Now().Add(5 * time.Second)
	for echoOn(t, tty) && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if _, err := master.Write([]byte(secret + "\n")); err != nil {
		t.Fatal(err)
	}
	var r result
	select {
	case r = <-got:
	case <-time.After(10 * time.Second):
		t.Fatal("the token was not read from the terminal")
	}
	if r.err != nil || r.tok != secret {
		t.Fatalf("read %q, %v; want %q", r.tok, r.err, secret)
	}
	// Whatever the terminal showed is on the master side by now.
	var shown bytes.Buffer
	buf := make([]byte, 4096)
	for {
		master.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
		n, err := master.Read(buf)
		shown.Write(buf[:n])
		if err != nil {
			if !errors.Is(err, os.ErrDeadlineExceeded) {
				t.Logf("reading the terminal: %v", err)
			}
			break
		}
	}
	if strings.Contains(shown.String(), secret) {
		t.Errorf("the terminal echoed the token: %q", shown.String())
	}
	if !echoOn(t, tty) {
		t.Error("the terminal was left without echo")
	}
}
