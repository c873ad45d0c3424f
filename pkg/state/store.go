package state

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"sort"
	"strconv"
	"time"

	"github.com/converge-csi/converge/pkg/classified"
	"github.com/converge-csi/converge/pkg/locks"
	bolt "go.etcd.io/bbolt"
	"k8s.io/utils/clock"
)

const (
	// SchemaVersion is the layout of the records; Open refuses any other.
	SchemaVersion = "1"
	// schemaLogged is the same layout while the log may hold records that
	// bbolt has not: from Open until a Close that checkpointed everything.
	// A binary older than the log reads schema 1 only, so it refuses such
	// a store rather than start without the log's intents (and release the
	// mounts they stand for as orphans).
	schemaLogged = "2"

	// lockTimeout bounds how long Open waits for the file lock of a store
	// that another live instance holds, so a second instance fails fast.
	lockTimeout = 2 * time.Second

	// recordShards is the number of locks records are spread over.
	recordShards = 64
)

var (
	bucketMeta    = []byte("meta")
	bucketVolumes = []byte("volumes")
	keySchema     = []byte("schema")
	// keyLogSeq holds the number of the last log record bbolt holds.
	keyLogSeq = []byte("log-seq")
	// keyWriter holds the release of the binary that last opened the
	// store (Options.Release), which a binary refusing the store's schema
	// names. Releases before v0.2.0 ignore it and do not write it.
	keyWriter = []byte("writer")
)

// ErrLocked is returned by Open when another process holds the store.
var ErrLocked = errors.New("state store is locked by another process")

// ErrNewerSchema is returned by Open for a store written with a schema
// newer than this binary reads: a rollback past a change of the store's
// format. The store is left as it was.
var ErrNewerSchema = errors.New("state store was written by a newer converge")

// Options are how a binary opens its store.
type Options struct {
	// Release is the running binary's release (e.g. v0.2.0), recorded in
	// the store and named by an older binary that refuses it. Empty: the
	// store keeps the one recorded before.
	Release string
}

// Store is the durable desired state: one record per volume, kept in a bbolt
// file and mirrored in memory. Every Update is durable before it returns, so
// the reconciler never acts on an intent that a crash could lose: written to
// the store's log with one fdatasync, and into bbolt at the log's next
// checkpoint (see writeLog).
//
// The Store also keeps, in memory only, the result of the latest attempt on
// each intent, and lets callers wait for a volume to change.
type Store struct {
	db  *bolt.DB
	log *writeLog

	// recordMu serialises the Updates of one record (sharded by ID), so its
	// mirror is updated in log order; records of different volumes are
	// written concurrently and share fdatasyncs.
	recordMu [recordShards]locks.Mutex

	// mu guards volumes, the mirror of the durable records.
	mu      locks.Mutex
	volumes map[string]*Volume

	// reports are what the plugin answers from memory: results, terminalFailures,
	// conditions and the watchers waiting for them. Lock order: a
	// record's recordMu, then the log's locks (its syncMu before its mu;
	// a checkpoint under the log's mu takes no lock of the store), then
	// mu; reports.mu is taken alone, never while another of the store's
	// locks is held.
	reports

	// replayed counts the log records Open applied.
	replayed int

	// clock stamps each record's Changed.
	clock clock.PassiveClock
}

// TerminalFailure is a terminal failure of one intent generation. It outlives the
// intent it refers to, so the request that made the intent can answer with
// it once the reconciler has rolled the intent back.
type TerminalFailure struct {
	// Generation is the intent generation that failed.
	Generation int64
	// Err is the failure.
	Err *classified.Error
}

// Result is the outcome of the reconciler's latest work on one intent.
type Result struct {
	// Generation is the intent generation the result refers to.
	Generation int64
	// Ready is true once the reconciler saw the intent fulfilled: its
	// operation succeeded, or a pass observed it.
	Ready bool
	// Err is the last failure, nil when the last attempt succeeded.
	Err *classified.Error
	// Waiting says what an unfulfilled intent without a failure waits for,
	// e.g. the repair of a damaged filesystem.
	Waiting string
	// Attempts counts consecutive failed attempts.
	Attempts int
	// NextRetry is when a failed intent is retried.
	NextRetry time.Time
}

// Open opens (creating if needed) the store at path and its log at
// path-wal, and replays the log. The parent directory is created with mode
// 0700. It fails with ErrLocked when another live process holds the store,
// and refuses a store written with another schema (ErrNewerSchema for a
// newer one) without changing it.
func Open(path string) (*Store, error) { return OpenWith(path, Options{}) }

// OpenWith is Open that records the running binary's release (see Options).
func OpenWith(path string, o Options) (*Store, error) { return open(path, DefaultLogSize, o) }

func open(path string, logSize int64, o Options) (*Store, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("creating state directory: %w", err)
	}
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: lockTimeout})
	if err != nil {
		if errors.Is(err, bolt.ErrTimeout) {
			return nil, fmt.Errorf("%w: %s", ErrLocked, path)
		}
		return nil, fmt.Errorf("opening state store %s: %w", path, err)
	}
	s := &Store{db: db, volumes: map[string]*Volume{}, reports: newReports(), clock: clock.RealClock{}}
	logSeq, err := s.load(path, o.Release)
	if err != nil {
		db.Close()
		return nil, err
	}
	if err := s.replay(path+"-wal", logSeq, logSize); err != nil {
		db.Close()
		return nil, err
	}
	opened := s.now()
	for id, v := range s.volumes {
		s.live[id] = true
		if v.Changed.IsZero() {
			v.Changed = opened
		}
	}
	return s, nil
}

// replay opens the log, applies the records it holds after logSeq, the
// last that bbolt holds, and commits them to bbolt when it can.
func (s *Store) replay(path string, logSeq uint64, size int64) error {
	l, n, err := recoverLog(path, logSeq, size, s.commit, func(id string, value []byte) error {
		if len(value) == 0 {
			delete(s.volumes, id)
			return nil
		}
		v := &Volume{}
		if err := json.Unmarshal(value, v); err != nil || v.ID != id {
			return fmt.Errorf("does not decode: %v", err)
		}
		s.volumes[id] = v
		return nil
	})
	if err != nil {
		return err
	}
	s.log, s.replayed = l, n
	return nil
}

// Replayed returns how many records Open took from the log: those written
// after the last checkpoint of a run that ended without closing the store.
func (s *Store) Replayed() int { return s.replayed }

// commit writes values (nil deletes) to bbolt in one transaction, with
// seq, the number of the last log record they come from.
func (s *Store) commit(values map[string][]byte, seq uint64) error {
	return s.db.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketVolumes)
		for id, raw := range values {
			var err error
			if raw == nil {
				err = b.Delete([]byte(id))
			} else {
				err = b.Put([]byte(id), raw)
			}
			if err != nil {
				return err
			}
		}
		return tx.Bucket(bucketMeta).Put(keyLogSeq, binary.BigEndian.AppendUint64(nil, seq))
	})
}

// load reads the records bbolt holds, and the number of the last log
// record among them, after checking the schema of the store at path; it
// records release as the store's writer.
func (s *Store) load(path, release string) (logSeq uint64, err error) {
	err = s.db.Update(func(tx *bolt.Tx) error {
		meta, err := tx.CreateBucketIfNotExists(bucketMeta)
		if err != nil {
			return err
		}
		if v := meta.Get(keySchema); v != nil && string(v) != SchemaVersion && string(v) != schemaLogged {
			return schemaError(path, string(v), releaseName(meta.Get(keyWriter)), release)
		}
		if err := meta.Put(keySchema, []byte(schemaLogged)); err != nil {
			return err
		}
		if releaseName([]byte(release)) != "" {
			if err := meta.Put(keyWriter, []byte(release)); err != nil {
				return err
			}
		}
		if raw := meta.Get(keyLogSeq); len(raw) == 8 {
			logSeq = binary.BigEndian.Uint64(raw)
		}
		vols, err := tx.CreateBucketIfNotExists(bucketVolumes)
		if err != nil {
			return err
		}
		return vols.ForEach(func(k, raw []byte) error {
			v := &Volume{}
			if err := json.Unmarshal(raw, v); err != nil {
				return fmt.Errorf("decoding record %q: %w", k, err)
			}
			s.volumes[string(k)] = v
			return nil
		})
	})
	return logSeq, err
}

// releaseNameRE is what a release's name may be to be recorded in the
// store and named in a refusal: a tag, or git describe's name of a build
// after one.
var releaseNameRE = regexp.MustCompile(`^v[0-9]{1,4}\.[0-9]{1,4}\.[0-9]{1,4}(-[0-9A-Za-z.-]{1,40})?$`)

// releaseName is b when it is a release's name, else "": the store's
// file is not trusted to hold what an operator is told to run.
func releaseName(b []byte) string {
	if !releaseNameRE.Match(b) {
		return ""
	}
	return string(b)
}

// schemaError is the refusal of a store at path whose schema this binary
// (of release self) does not read, written last by writer: it says what
// the operator can do. A binary never changes such a store, so running the
// release that wrote it again finds it as it was.
func schemaError(path, schema, writer, self string) error {
	if self == "" {
		self = "this release"
	}
	newest, _ := strconv.Atoi(schemaLogged)
	if n, err := strconv.Atoi(schema); err == nil && n > newest {
		by, run := "a release newer than this one", "the release that wrote it"
		if writer != "" {
			by, run = "converge "+writer, writer
		}
		return fmt.Errorf("%w: %s has schema %s, written by %s; converge %s reads schemas %s and %s only, "+
			"so it was rolled back past a change of the store's format. Nothing was changed: run %s or a later release on this node "+
			"(docs/releasing.md, \"Rolling back\", says which releases read which schema)",
			ErrNewerSchema, path, schema, by, self, SchemaVersion, schemaLogged, run)
	}
	return fmt.Errorf("%s has schema %q, which no converge release wrote (converge %s reads schemas %s and %s): "+
		"it is not a converge state store, or it is damaged; nothing was changed", path, schema, self, SchemaVersion, schemaLogged)
}

// Close commits the log to bbolt (when it cannot, the log keeps the
// records for the next Open) and closes the store. Waiters are not woken.
func (s *Store) Close() error {
	clean, err := s.log.close()
	if clean {
		err = errors.Join(err, s.db.Update(func(tx *bolt.Tx) error {
			return tx.Bucket(bucketMeta).Put(keySchema, []byte(SchemaVersion))
		}))
	}
	return errors.Join(err, s.db.Close())
}

// Get returns a deep copy of the record of id, or ErrNotFound.
func (s *Store) Get(id string) (*Volume, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	v, ok := s.volumes[id]
	if !ok {
		return nil, ErrNotFound
	}
	return v.DeepCopy(), nil
}

// List returns deep copies of all records, sorted by ID.
func (s *Store) List() []*Volume {
	s.mu.Lock()
	out := make([]*Volume, 0, len(s.volumes))
	for _, v := range s.volumes {
		out = append(out, v.DeepCopy())
	}
	s.mu.Unlock()
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

// Update applies fn to the record of id (a fresh record when there is none)
// in one durable transaction and returns the record as stored. If fn returns
// an error nothing changes. If fn changes nothing, nothing is written and the
// generation stays. Otherwise the generation is bumped, Changed is set to
// now, every intent whose spec or deletion changed takes the new
// generation, and a record left empty is deleted.
func (s *Store) Update(id string, fn func(v *Volume) error) (*Volume, error) {
	v, durable, err := s.UpdateUnsynced(id, fn)
	if err != nil {
		return nil, err
	}
	if err := durable(); err != nil {
		return nil, err
	}
	return v, nil
}

// UpdateUnsynced is Update that does not wait for the disk: it returns once the
// record is in the log file and in memory, where the reconciler acts on it
// and where the next Open finds it however this process ends (the kernel
// holds the written pages). durable returns once the record also survives
// a crash of the machine (an fdatasync that concurrent writers share).
//
// So the work on a record may overlap its fdatasync: what the reconciler
// builds (mounts, loop devices) is kernel state, which a crash of the
// machine takes away together with the record's unsynced pages. A request
// answers only once durable returned nil. When durable fails, the log
// refuses every later write and the plugin must be restarted; the record
// stays in memory meanwhile.
func (s *Store) UpdateUnsynced(id string, fn func(v *Volume) error) (v *Volume, durable func() error, err error) {
	mu := &s.recordMu[shard(id)]
	mu.Lock()
	defer mu.Unlock()

	old, cur, err := s.edit(id, fn)
	if err != nil {
		return nil, nil, err
	}
	if old != nil && reflect.DeepEqual(old, cur) || old == nil && cur.Empty() {
		// Nothing to write; an earlier write of the same content may
		// still be on its way to the disk.
		seq := s.log.written.Load()
		return cur, func() error { return s.log.sync(seq) }, nil
	}
	s.stamp(old, cur)
	raw, err := marshalRecord(cur)
	if err != nil {
		return nil, nil, err
	}
	seq, err := s.log.append(id, raw)
	if NoSpace(err) {
		// Nothing was committed: the records stay as they were.
		return nil, nil, classified.Errorf(classified.KindResourceExhausted, "the state directory is full; cannot record the request for volume %s: %w", id, err)
	}
	if err != nil {
		return nil, nil, fmt.Errorf("writing record %s: %w", id, err)
	}

	// The record is in the log file, not yet synced nor in memory.
	// gofail: var stateLogAfterWrite struct{}
	s.remember(cur)
	return cur, func() error {
		if err := s.log.sync(seq); err != nil {
			return fmt.Errorf("writing record %s: %w", id, err)
		}
		return nil
	}, nil
}

// edit applies fn to a copy of the record of id (a fresh record when
// there is none) and returns the record as it was (nil for none) and as
// fn left it, in the form it is compared and stored in: fn cannot change
// its ID, and empty publishes and snapshots are nil. If fn returns an
// error, it is returned and nothing changes.
func (s *Store) edit(id string, fn func(v *Volume) error) (old, cur *Volume, err error) {
	s.mu.Lock()
	old = s.volumes[id]
	s.mu.Unlock()
	cur = old.DeepCopy()
	if cur == nil {
		cur = &Volume{}
	}
	cur.ID = id // the volume a transition's refusal names
	if err := fn(cur); err != nil {
		return nil, nil, err
	}
	cur.ID = id
	if len(cur.Publishes) == 0 {
		cur.Publishes = nil
	}
	if len(cur.Snapshots) == 0 {
		cur.Snapshots = nil
	}
	return old, cur, nil
}

// stamp makes cur, a change of old (nil for a new record), the next
// generation of the record, changed now, and gives each of its intents
// that changed that generation (stampGenerations).
func (s *Store) stamp(old, cur *Volume) {
	var prevGen int64
	if old != nil {
		prevGen = old.Generation
	}
	cur.Generation = prevGen + 1
	cur.Changed = s.now()
	stampGenerations(old, cur)
}

// marshalRecord is what the log holds for v: its JSON, or nothing (nil)
// for an empty record, which a replay and a checkpoint take for the
// record's deletion.
func marshalRecord(v *Volume) ([]byte, error) {
	if v.Empty() {
		return nil, nil
	}
	raw, err := json.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("encoding record %s: %w", v.ID, err)
	}
	return raw, nil
}

// remember puts v, just written to the log, in the mirror (or takes its
// record out when v is empty) and tells the reports, which wake the
// waiters of the volume.
func (s *Store) remember(v *Volume) {
	s.mu.Lock()
	if v.Empty() {
		delete(s.volumes, v.ID)
	} else {
		s.volumes[v.ID] = v.DeepCopy()
	}
	s.mu.Unlock()
	s.reports.recorded(v)
}

// now is the time a record is stamped with: without the monotonic
// reading and in UTC, so a record read back from the disk equals the one
// written.
func (s *Store) now() time.Time { return s.clock.Now().UTC().Round(0) }

// shard picks the lock of a record.
func shard(id string) int {
	h := fnv.New32a()
	h.Write([]byte(id))
	return int(h.Sum32() % recordShards)
}

// stampGenerations gives every intent of cur that differs from old the
// generation of cur. A new expansion (one whose generation is still 0) is a
// new request even for the same size, so that an expansion that failed for
// good is tried again when it is asked for again. IO limits take a new
// generation when they change (a new intent's is still 0), and only then.
func stampGenerations(old, cur *Volume) {
	var oldStage *Stage
	var oldPubs map[string]*Publish
	if old != nil {
		oldStage, oldPubs = old.Stage, old.Publishes
	}
	if st := cur.Stage; st != nil {
		if oldStage == nil || !oldStage.SameSpec(st) || oldStage.Deleting != st.Deleting {
			st.Generation = cur.Generation
		}
	}
	if e := cur.Expand; e != nil {
		if old == nil || old.Expand == nil || old.Expand.Bytes != e.Bytes || e.Generation == 0 {
			e.Generation = cur.Generation
		}
	}
	if l := cur.IOLimits; l != nil {
		if old == nil || old.IOLimits == nil || old.IOLimits.Limits != l.Limits || l.Generation == 0 {
			l.Generation = cur.Generation
		}
	}
	for id, s := range cur.Snapshots {
		if old == nil || old.Snapshots[id] == nil {
			s.Generation = cur.Generation
		}
	}
	for target, p := range cur.Publishes {
		o := oldPubs[target]
		if o == nil || !o.SameSpec(p) || o.Deleting != p.Deleting {
			p.Generation = cur.Generation
		}
	}
}
