package ledger

// The on-disk form of a family's ledger.
//
// Why one append-only log per family, and not one file per key: a claim is
// one write and one fdatasync of one file, where a file per key needs the
// file written and synced, renamed, and its directory synced (two syncs,
// and a directory of up to Limits.Records entries); concurrent claims of a
// family share one sync (group commit, store.go), which a file per key
// cannot; and reading a family back is one sequential read. What a log
// costs is compaction, which rewrites the live records once the log has
// grown to twice their size (and at least compactMin), so a family's log
// stays within Limits.LogBytes whatever the guests do.
//
// Format: <root>/families/<family>/log, text, one entry per line:
//
//	CRC SP JSON LF
//
// CRC is the CRC-32C (Castagnoli) of JSON as 8 lowercase hex digits. The
// first line's JSON is the header {"ledger":1,"family":ID}; every other
// line is a whole Record (its full new state, so replaying the log is
// "the last line of each key wins" and compaction writes one line per
// key). JSON escapes every control character, so an entry is one line.
//
// A crash can leave a torn tail: a last line half written, or (on a
// filesystem that allocates before it writes) blocks of zeros. Nothing
// past the last completed fdatasync was answered to anyone, so on open
// the log is cut at its first bad line (no newline, bad CRC, bad JSON,
// bad record) when what follows that line is at most tornLimit bytes,
// which is more than every entry one group commit can leave unsynced. A
// bad line further from the end is damage to answered records: the family
// is refused with ErrCorrupt and the file left alone.

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"path/filepath"
	"strconv"

	"golang.org/x/sys/unix"
)

const (
	logVersion  = 1
	dirFamilies = "families"
	fileLog     = "log"
	fileLogNew  = "log.new"
	// maxEntry bounds one line of the log: a record with a key, result and
	// holder at their bounds, every byte escaped by JSON (\u00XX: 6 bytes,
	// which no entry this package writes comes near), its fields and CRC.
	maxEntry = 6*(MaxKey+MaxResult+2*MaxName) + 512
	// tornLimit is the most bytes cut from a log's tail on open.
	tornLimit = 4 << 20
	// compactMin: a log under this size is never compacted.
	compactMin = 1 << 20
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

type logHeader struct {
	Ledger int    `json:"ledger"`
	Family string `json:"family"`
}

// encodeLine is one log line: CRC, space, JSON, newline.
func encodeLine(v any) ([]byte, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	// Results and keys hold no control characters, so with HTML escaping
	// off only " and \ are escaped: an entry is at most about twice its
	// text.
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	js := bytes.TrimSuffix(buf.Bytes(), []byte("\n"))
	line := make([]byte, 0, len(js)+10)
	line = fmt.Appendf(line, "%08x ", crc32.Checksum(js, castagnoli))
	line = append(line, js...)
	return append(line, '\n'), nil
}

// decodeLine checks a line's CRC and returns its JSON.
func decodeLine(line []byte) ([]byte, bool) {
	if len(line) < 11 || line[8] != ' ' || line[len(line)-1] != '\n' {
		return nil, false
	}
	want, err := strconv.ParseUint(string(line[:8]), 16, 32)
	if err != nil {
		return nil, false
	}
	js := line[9 : len(line)-1]
	return js, crc32.Checksum(js, castagnoli) == uint32(want)
}

// replay reads a family's log into recs and returns the length of its good
// prefix. A tail that is bad within tornLimit of the end is reported as
// torn (cut > 0), not as an error. A line whose CRC holds but whose content
// does not (another family's header, a record out of bounds) was written
// whole, so it is no torn write: that is ErrCorrupt wherever it is.
func replay(r io.Reader, size int64, family string, recs map[string]Record) (good, cut int64, err error) {
	br := bufio.NewReaderSize(r, maxEntry+1)
	var off int64
	for n := 0; ; n++ {
		line, rerr := br.ReadSlice('\n')
		if rerr == io.EOF && len(line) == 0 {
			return off, 0, nil
		}
		var js []byte
		ok := rerr == nil
		if ok {
			js, ok = decodeLine(line)
		}
		if !ok {
			if size-off > tornLimit {
				return off, 0, fmt.Errorf("bad entry at byte %d of %d: %w", off, size, ErrCorrupt)
			}
			return off, size - off, nil
		}
		if err := decodeEntry(js, n, family, recs); err != nil {
			return off, 0, fmt.Errorf("entry at byte %d: %w: %w", off, err, ErrCorrupt)
		}
		off += int64(len(line))
	}
}

func decodeEntry(js []byte, n int, family string, recs map[string]Record) error {
	dec := json.NewDecoder(bytes.NewReader(js))
	dec.DisallowUnknownFields()
	if n == 0 {
		var h logHeader
		if err := dec.Decode(&h); err != nil {
			return err
		}
		if h.Ledger != logVersion || h.Family != family {
			return fmt.Errorf("header says version %d family %q, want %d %q", h.Ledger, h.Family, logVersion, family)
		}
		return nil
	}
	var rec Record
	if err := dec.Decode(&rec); err != nil {
		return err
	}
	if err := rec.check(); err != nil {
		return err
	}
	recs[rec.Key] = rec
	return nil
}

// openLog opens (creating) a family's log and reads it; the store writes
// at the size returned. A
// torn tail is cut, and the cut synced, before anything is appended.
func openLog(dir, family string) (f *os.File, size int64, recs map[string]Record, cut int64, err error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, 0, nil, 0, err
	}
	// A compaction that died before its rename leaves this; the log is whole.
	os.Remove(filepath.Join(dir, fileLogNew))
	path := filepath.Join(dir, fileLog)
	f, err = os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, 0, nil, 0, err
	}
	defer func() {
		if err != nil {
			f.Close()
		}
	}()
	st, err := f.Stat()
	if err != nil {
		return nil, 0, nil, 0, err
	}
	recs = map[string]Record{}
	good, cut, err := replay(f, st.Size(), family, recs)
	if err != nil {
		return nil, 0, nil, 0, fmt.Errorf("%s: %w", path, err)
	}
	if cut > 0 || good == 0 {
		if err := f.Truncate(good); err != nil {
			return nil, 0, nil, 0, err
		}
	}
	if good == 0 {
		// New, or only a torn header: start with one.
		hdr, err := encodeLine(logHeader{Ledger: logVersion, Family: family})
		if err != nil {
			return nil, 0, nil, 0, err
		}
		if _, err := f.WriteAt(hdr, 0); err != nil {
			return nil, 0, nil, 0, err
		}
		good = int64(len(hdr))
	}
	if err := unix.Fdatasync(int(f.Fd())); err != nil {
		return nil, 0, nil, 0, err
	}
	if err := syncDir(dir); err != nil {
		return nil, 0, nil, 0, err
	}
	return f, good, recs, cut, nil
}

// writeCompacted writes a new log holding recs (in the order given) next
// to the old one, syncs it, renames it over the old one and syncs the
// directory: a crash leaves either log whole. It returns the new log open
// for writing at its end (the size returned). replaced is true when the
// rename happened, even if err is not nil (the directory sync failed):
// the old file is then no longer the log.
func writeCompacted(dir, family string, recs []Record) (f *os.File, size int64, replaced bool, err error) {
	tmp := filepath.Join(dir, fileLogNew)
	f, err = os.OpenFile(tmp, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return nil, 0, false, err
	}
	fail := func(err error) (*os.File, int64, bool, error) {
		f.Close()
		os.Remove(tmp)
		return nil, 0, false, err
	}
	w := bufio.NewWriterSize(f, 64<<10)
	hdr, err := encodeLine(logHeader{Ledger: logVersion, Family: family})
	if err != nil {
		return fail(err)
	}
	size = int64(len(hdr))
	w.Write(hdr)
	for _, r := range recs {
		line, err := encodeLine(r)
		if err != nil {
			return fail(err)
		}
		size += int64(len(line))
		w.Write(line)
	}
	if err := w.Flush(); err != nil {
		return fail(err)
	}
	if err := unix.Fdatasync(int(f.Fd())); err != nil {
		return fail(err)
	}
	if err := os.Rename(tmp, filepath.Join(dir, fileLog)); err != nil {
		return fail(err)
	}
	if err := syncDir(dir); err != nil {
		f.Close()
		return nil, 0, true, err
	}
	return f, size, true, nil
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	if err := d.Sync(); err != nil && !errors.Is(err, unix.EINVAL) {
		return err
	}
	return nil
}
