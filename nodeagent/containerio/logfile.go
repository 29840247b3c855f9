package containerio

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
)

// The CRI log format's streams and tags (k8s.io/cri-api's LogStreamType and LogTag) and its timestamp layout
// (cri-client's logs.RFC3339NanoFixed: always nine digits of nanoseconds), spelled out here so that the stdio
// process, a binary of its own, links neither; TestCRILogFormatNames checks they agree.
type logStream string

type logTag string

const (
	streamStdout     logStream = "stdout"
	streamStderr     logStream = "stderr"
	tagFull          logTag    = "F"
	tagPartial       logTag    = "P"
	rfc3339NanoFixed           = "2006-01-02T15:04:05.000000000Z07:00"
)

// rotatedStamp names a rotated file, as the kubelet's container log manager does: <log>.<YYYYMMDD-HHMMSS>.
const rotatedStamp = "20060102-150405"

// logFile is a container's CRI log file. Both streams write through one logFile, and the mutex keeps their
// lines whole and their timestamps in file order.
type logFile struct {
	mu       sync.Mutex
	path     string
	maxSize  int64 // rotate before a write would pass this; 0: never
	maxFiles int   // files kept, current included
	f        *os.File
	size     int64
	line     []byte // reused buffer for one formatted line
	failing  bool   // the last write failed; report only the first failure of a run
	logger   hclog.Logger
}

func openLogFile(spec Spec, logger hclog.Logger) (*logFile, error) {
	l := &logFile{path: spec.LogPath, maxSize: spec.MaxSize, maxFiles: max(spec.MaxFiles, 1), logger: logger}
	if err := l.open(); err != nil {
		return nil, err
	}
	return l, nil
}

func (l *logFile) open() error {
	f, err := os.OpenFile(l.path, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o640)
	if err != nil {
		return err
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return err
	}
	l.f, l.size = f, st.Size()
	return nil
}

// appendLine formats one CRI log line: "<timestamp> <stream> <tag> <content>\n". content holds no newline.
func appendLine(b []byte, t time.Time, stream logStream, tag logTag, content []byte) []byte {
	b = t.AppendFormat(b, rfc3339NanoFixed)
	b = append(b, ' ')
	b = append(b, stream...)
	b = append(b, ' ')
	b = append(b, tag...)
	b = append(b, ' ')
	b = append(b, content...)
	return append(b, '\n')
}

// write appends one line, rotating first if the line would take the file past maxSize. A failure is logged,
// not returned: the container must not block on a full disk, so its output is dropped instead.
func (l *logFile) write(stream logStream, tag logTag, content []byte) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.line = appendLine(l.line[:0], time.Now().UTC(), stream, tag, content)
	if l.maxSize > 0 && l.size > 0 && l.size+int64(len(l.line)) > l.maxSize {
		if err := l.rotate(); err != nil {
			// Try again after another maxSize bytes rather than on every line.
			l.logger.Error("rotate log", "path", l.path, "error", err)
			l.size = 0
		}
	}
	n, err := l.f.Write(l.line)
	l.size += int64(n)
	if err != nil && !l.failing {
		l.logger.Error("write log; dropping output until a write succeeds", "path", l.path, "error", err)
	}
	l.failing = err != nil
}

// rotate renames the current file aside, starts a new one, and removes the oldest rotated files beyond
// maxFiles. A reader following the log sees the new file created under the old name and reopens it.
func (l *logFile) rotate() error {
	name, err := rotatedName(l.path, time.Now())
	if err != nil {
		return err
	}
	if err := os.Rename(l.path, name); err != nil {
		return err
	}
	old := l.f
	if err := l.open(); err != nil {
		// Keep writing to the renamed file rather than losing output.
		return err
	}
	old.Close()
	return l.prune()
}

// rotatedName is <path>.<stamp>, or <path>.<stamp>.<n> when the file rotates again within the second: the
// suffix goes past the newest rotated file's, so that names keep sorting oldest first after pruning has
// freed the unsuffixed one. If the clock went back, the newest stamp is reused.
func rotatedName(path string, now time.Time) (string, error) {
	rotated, err := rotatedFiles(path)
	if err != nil {
		return "", err
	}
	stamp := now.Format(rotatedStamp)
	if len(rotated) == 0 || rotated[len(rotated)-1].stamp < stamp {
		return path + "." + stamp, nil
	}
	last := rotated[len(rotated)-1]
	return path + "." + last.stamp + "." + strconv.Itoa(last.n+1), nil
}

// prune removes the oldest rotated files so that at most maxFiles remain, the current one included.
func (l *logFile) prune() error {
	rotated, err := rotatedFiles(l.path)
	if err != nil {
		return err
	}
	var errs []error
	for len(rotated) > l.maxFiles-1 {
		errs = append(errs, os.Remove(rotated[0].path))
		rotated = rotated[1:]
	}
	return errors.Join(errs...)
}

// rotatedFile is a name rotatedName made: <log>.<stamp>[.<n>].
type rotatedFile struct {
	path  string
	stamp string
	n     int // 0 without a suffix
}

// rotatedFiles lists the rotated files of path, oldest first. Names that rotatedName would not make are not
// ours and are left alone.
func rotatedFiles(path string) ([]rotatedFile, error) {
	entries, err := os.ReadDir(filepath.Dir(path))
	if err != nil {
		return nil, err
	}
	var found []rotatedFile
	prefix := filepath.Base(path) + "."
	for _, e := range entries {
		rest, ok := strings.CutPrefix(e.Name(), prefix)
		if !ok || len(rest) < len(rotatedStamp) {
			continue
		}
		stamp, suffix := rest[:len(rotatedStamp)], rest[len(rotatedStamp):]
		if _, err := time.Parse(rotatedStamp, stamp); err != nil {
			continue
		}
		n := 0
		if suffix != "" {
			digits, ok := strings.CutPrefix(suffix, ".")
			if n, err = strconv.Atoi(digits); !ok || err != nil || n < 1 {
				continue
			}
		}
		found = append(found, rotatedFile{filepath.Join(filepath.Dir(path), e.Name()), stamp, n})
	}
	slices.SortFunc(found, func(a, b rotatedFile) int {
		if c := strings.Compare(a.stamp, b.stamp); c != 0 {
			return c
		}
		return a.n - b.n
	})
	return found, nil
}

func (l *logFile) Close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.f.Close()
}
