// CPU emulation of the CUDA features our kernels use, so the same .cu source runs under g++.
//
// Every CUDA thread is one OS thread (kept for later blocks: see Crew) or one fiber (a stack of its
// own) on the slot's OS thread, as each launch's mode says; builds with EMU_FIBERS (those without a
// sanitizer) have both, and both fiber switches (see switch_context). A block's fibers run
// round-robin and one that must wait (at __syncthreads or a warp intrinsic) yields to the next. Fibers follow the
// same rules through the same code as threads, run far faster (no OS thread per CUDA thread, no
// kernel round trip at each wait), and turn a block
// whose threads all wait forever into a reported deadlock instead of a hang. ThreadSanitizer needs
// OS threads to see races, so sanitized builds have only them.
//
// A block's threads meet at __syncthreads() on a barrier; a thread that returns drops out of it.
// Threads are grouped into warps of 32 lanes (by linear thread index, as CUDA does); the warp
// intrinsics (__shfl*_sync, __ballot_sync, __syncwarp) are rendezvous points where the warp's
// live lanes advance in lockstep, exchange values through a per-warp mailbox, and check their
// masks: a lane outside its own mask, lanes that disagree on the intrinsic or the mask, a mask
// naming a lane that did not arrive, or a shuffle from such a lane, is recorded as an error and
// the launch fails.
//
// Blocks: the emulation loads one copy of the kernel library per "slot" and runs the slots on
// separate threads at once, block k on slot k % slots, so two blocks really run concurrently
// (ThreadSanitizer sees inter-block races) while each slot's static __shared__ variables are the
// memory of the one block it runs at a time. Dynamic shared memory (``extern __shared__`` on the
// GPU, reached through dynamic_shared_memory(), which each .cu defines unless
// EMULATED_DYNAMIC_SHARED_MEMORY is set) is a heap block of exactly the launch's size, filled
// with 0xff bytes (NaN), so AddressSanitizer reports any access past it.
//
// Vector types carry CUDA's alignment; the emulation builds with -fsanitize=alignment, so a
// float4/double2 access at a misaligned address stops the process with "misaligned address".
//
// Used by emulation.py (force-included with g++ -include); never seen by NVRTC or nvcc.
#pragma once
#include <algorithm>
#include <atomic>
#include <cmath>
#include <barrier>
#include <condition_variable>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <optional>
#include <vector>
#include <semaphore.h>
#include <unistd.h>
#ifdef EMU_FIBERS
#include <sys/mman.h>
#include <ucontext.h>
#endif

#define EMULATED_DYNAMIC_SHARED_MEMORY 1

struct dim3 {
    unsigned x, y, z;
    constexpr dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};
typedef dim3 uint3;

struct alignas(8) float2 { float x, y; };
struct alignas(16) float4 { float x, y, z, w; };
struct alignas(16) double2 { double x, y; };
inline float2 make_float2(float x, float y) { return {x, y}; }
inline float4 make_float4(float x, float y, float z, float w) { return {x, y, z, w}; }
inline double2 make_double2(double x, double y) { return {x, y}; }

namespace emu {
constexpr unsigned warp_size = 32;

#ifdef EMU_FIBERS
// A fiber's saved machine state, and the switch between two of them. On x86-64 a switch saves the
// callee-saved registers, MXCSR and the x87 control word on the old stack and swaps stack pointers:
// no system call (ucontext's swapcontext saves the signal mask with one, which made it the
// emulation's main cost). Elsewhere ucontext does it; on x86-64 a launch may choose ucontext too
// (use_ucontext, from the launch's mode), so that x86-64 machines test what other machines run.
#if defined(__x86_64__)
#define EMU_STACK_SWITCH 1
extern "C" void emu_switch_context(void** save_sp, void* load_sp);
asm(R"(
    .text
    .globl emu_switch_context
    .hidden emu_switch_context
    .type emu_switch_context, @function
emu_switch_context:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    subq $8, %rsp
    stmxcsr (%rsp)
    fnstcw 4(%rsp)
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    ldmxcsr (%rsp)
    fldcw 4(%rsp)
    addq $8, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
    .size emu_switch_context, .-emu_switch_context
)");
#endif

// Whether this thread's fibers switch with ucontext (set by launch() for its blocks).
#ifdef EMU_STACK_SWITCH
inline thread_local bool use_ucontext = false;
#else
inline thread_local bool use_ucontext = true;
#endif

struct Context {
    void* sp = nullptr;  // (the stack switch)
    ucontext_t uc;       // (ucontext)
};

inline void switch_context(Context& from, const Context& to)
{
#ifdef EMU_STACK_SWITCH
    if (!use_ucontext) {
        emu_switch_context(&from.sp, to.sp);
        return;
    }
#endif
    swapcontext(&from.uc, &to.uc);
}

// Lays out a new stack as the switch leaves a suspended one, so that switching to it "returns"
// into ``entry`` (with the stack switch: aligned as after a call).
inline void make_context(Context& context, unsigned char* stack, size_t bytes, void (*entry)())
{
#ifdef EMU_STACK_SWITCH
    if (!use_ucontext) {
        unsigned mxcsr = 0;
        unsigned short control = 0;
        asm volatile("stmxcsr %0" : "=m"(mxcsr));
        asm volatile("fnstcw %0" : "=m"(control));
        void** sp = (void**)(((uintptr_t)(stack + bytes)) & ~(uintptr_t)15);
        *--sp = nullptr;          // the return address entry never uses (it switches away instead of returning)
        *--sp = (void*)entry;     // where emu_switch_context's ret goes
        for (int k = 0; k < 6; ++k) *--sp = nullptr;  // rbp, rbx, r12..r15
        *--sp = (void*)((uintptr_t)mxcsr | (uintptr_t)control << 32);
        context.sp = sp;
        return;
    }
#endif
    getcontext(&context.uc);
    context.uc.uc_stack.ss_sp = stack;
    context.uc.uc_stack.ss_size = bytes;
    context.uc.uc_link = nullptr;
    makecontext(&context.uc, entry, 0);
}
#endif  // EMU_FIBERS

#ifdef EMU_FIBERS
// The fibers of the block a slot runs now. ``progress`` counts every change a waiting fiber may be
// waiting for (an arrival, a completed rendezvous or barrier phase, a fiber's end): a whole round
// in which it does not move means every live fiber re-checked its condition in vain, a deadlock.
struct Fiber {
    Context context;
    unsigned char* stack;
    bool done;
    const char* waiting_at;  // the intrinsic it waits in, for the deadlock report
};

struct Scheduler {
    Context main;
    Fiber* fibers = nullptr;
    unsigned current = 0;
    unsigned long long progress = 0;
    void (*run)(void*) = nullptr;  // the kernel body, type-erased for the fibers' entry
    void* body = nullptr;
};
inline thread_local Scheduler* scheduler = nullptr;

inline void note_progress() { ++scheduler->progress; }

// Waits (yielding to the block's other fibers) until ``ready()``.
template <class Predicate>
void wait_until(const char* where, Predicate ready)
{
    Fiber& self = scheduler->fibers[scheduler->current];
    while (!ready()) {
        self.waiting_at = where;
        switch_context(self.context, scheduler->main);
    }
    self.waiting_at = nullptr;
}

// The fiber barrier (std::barrier's arrive_and_wait and arrive_and_drop, for fibers).
class FiberBarrier {
  public:
    explicit FiberBarrier(std::ptrdiff_t expected) : expected_(expected) {}
    void arrive_and_wait()
    {
        const unsigned long long phase = phase_;
        note_progress();
        if (++arrived_ == expected_) {
            complete();
            return;
        }
        wait_until("__syncthreads", [&] { return phase_ != phase; });
    }
    void arrive_and_drop()
    {
        note_progress();
        if (--expected_ > 0 && arrived_ == expected_) complete();
    }

  private:
    void complete()
    {
        arrived_ = 0;
        ++phase_;
    }
    std::ptrdiff_t expected_, arrived_ = 0;
    unsigned long long phase_ = 0;
};
#endif  // EMU_FIBERS

// Whether this thread runs fibers now (the slot's thread during a fiber launch): the warp's lock,
// its condition and the block's barrier then work by yielding to the block's other fibers (one OS
// thread runs them all, so the lock has nothing to exclude); on OS threads they are the standard ones.
inline bool on_fibers()
{
#ifdef EMU_FIBERS
    return scheduler != nullptr;
#else
    return false;
#endif
}

struct Mutex {
    std::mutex os;
    void lock()
    {
        if (!on_fibers()) os.lock();
    }
    void unlock()
    {
        if (!on_fibers()) os.unlock();
    }
};

struct Condition {
    std::condition_variable_any os;
    void notify_all()
    {
#ifdef EMU_FIBERS
        if (on_fibers()) return note_progress();
#endif
        os.notify_all();
    }
    template <class Lock, class Predicate>
    void wait(Lock& lock, Predicate ready)
    {
#ifdef EMU_FIBERS
        if (on_fibers()) return wait_until("a warp intrinsic", ready);
#endif
        os.wait(lock, ready);
    }
};

// __syncthreads' barrier: std::barrier for a block on OS threads, else the fiber barrier.
class Barrier {
  public:
    Barrier(std::ptrdiff_t expected, bool os_threads)
#ifdef EMU_FIBERS
        : fibers_(expected)
#endif
    {
        if (os_threads) os_.emplace(expected);
    }
    void arrive_and_wait()
    {
#ifdef EMU_FIBERS
        if (!os_) return fibers_.arrive_and_wait();
#endif
        os_->arrive_and_wait();
    }
    void arrive_and_drop()
    {
#ifdef EMU_FIBERS
        if (!os_) return fibers_.arrive_and_drop();
#endif
        os_->arrive_and_drop();
    }

  private:
    std::optional<std::barrier<>> os_;
#ifdef EMU_FIBERS
    FiberBarrier fibers_;
#endif
};

struct Warp {
    Mutex mutex;
    Condition changed;
    unsigned existing = 0;         // lanes of this warp inside the block (the last warp may be partial)
    unsigned alive = 0;            // existing lanes that have not returned
    unsigned arrived = 0;          // lanes waiting at the current rendezvous
    unsigned long long phase = 0;  // completed rendezvous count; the mailbox alternates by parity
    unsigned participants[2] = {0, 0};
    const char* op[2][warp_size] = {};
    unsigned mask[2][warp_size] = {};
    int predicate[2][warp_size] = {};
    unsigned char value[2][warp_size][16] = {};
};

struct Block {
    Barrier* barrier;
    std::unique_ptr<Warp[]> warps;
    unsigned char* dynamic_shared;
};

inline thread_local uint3 thread_idx, block_idx;
inline thread_local dim3 block_dim, grid_dim;
inline thread_local Block* block = nullptr;
inline thread_local unsigned lane = 0, warp = 0;

inline std::mutex error_mutex;
// Every lane's complaint, as (kind, text): reported sorted by kind, then text, so runs agree.
inline std::vector<std::pair<int, std::string>> errors;
inline std::string error_report;

enum ErrorKind { excluded_self, absent_lanes, diverged, mixed_masks, absent_source, deadlock, no_memory, no_fibers };

inline void fail(int kind, const char* format, ...)
{
    char text[512];
    va_list args;
    va_start(args, format);
    std::vsnprintf(text, sizeof text, format, args);
    va_end(args);
    std::lock_guard<std::mutex> guard(error_mutex);
    errors.emplace_back(kind, text);
}

inline void syncthreads() { block->barrier->arrive_and_wait(); }

inline void complete_phase(Warp& w)
{
    const int parity = (int)(w.phase & 1);
    w.participants[parity] = w.arrived;
    w.arrived = 0;
    ++w.phase;
    w.changed.notify_all();
}

// One lane's visit to a warp intrinsic. Waits until every live lane of the warp has arrived at
// some intrinsic, checks the masks, and returns the value of lane ``source`` (when >= 0) in
// ``result`` and, through ``ballot``, the predicates of the lanes in the mask.
inline void rendezvous(const char* op, unsigned mask, const void* value, size_t size, int source, void* result,
                       int predicate, unsigned* ballot)
{
    Warp& w = block->warps[warp];
    std::unique_lock<Mutex> lock(w.mutex);
    const unsigned long long phase = w.phase;
    const int parity = (int)(phase & 1);
    w.op[parity][lane] = op;
    w.mask[parity][lane] = mask;
    w.predicate[parity][lane] = predicate;
    if (size) std::memcpy(w.value[parity][lane], value, size);
    w.arrived |= 1u << lane;
    if (w.arrived == w.alive)
        complete_phase(w);
    else
        w.changed.wait(lock, [&] { return w.phase != phase; });
    const unsigned present = w.participants[parity];
    const unsigned where = block_idx.x + grid_dim.x * (block_idx.y + grid_dim.y * block_idx.z);
    if (!(mask >> lane & 1u))
        fail(excluded_self, "%s: lane %u of warp %u (block %u) calls it with mask 0x%08x, which excludes the lane itself",
             op, lane, warp, where, mask);
    if (mask & w.existing & ~present)
        fail(absent_lanes, "%s: mask 0x%08x names lanes 0x%08x of warp %u (block %u) that returned or did not reach it",
             op, mask, mask & w.existing & ~present, warp, where);
    for (unsigned other = 0; other < warp_size; ++other) {
        if (!(present >> other & 1u)) continue;
        if (std::strcmp(w.op[parity][other], op) != 0)
            fail(diverged, "%s: lanes of warp %u (block %u) diverged: lane %u is at %s", op, warp, where, other,
                 w.op[parity][other]);
        else if (w.mask[parity][other] != mask && (mask >> other & 1u))
            fail(mixed_masks, "%s: lanes %u and %u of warp %u (block %u) pass different masks 0x%08x and 0x%08x", op, lane,
                 other, warp, where, mask, w.mask[parity][other]);
    }
    if (source >= 0) {
        if (!(present >> source & 1u) || !(mask >> source & 1u))
            fail(absent_source, "%s: lane %u of warp %u (block %u) reads lane %d, which is not in mask 0x%08x or not there", op,
                 lane, warp, where, source, mask);
        std::memcpy(result, w.value[parity][source], size);
    }
    if (ballot) {
        unsigned bits = 0;
        for (unsigned other = 0; other < warp_size; ++other)
            if ((present & mask) >> other & 1u && w.predicate[parity][other]) bits |= 1u << other;
        *ballot = bits;
    }
}

inline void leave_warp()
{
    Warp& w = block->warps[warp];
    std::lock_guard<Mutex> guard(w.mutex);
    w.alive &= ~(1u << lane);
    if (w.arrived && w.arrived == w.alive) complete_phase(w);
}

template <class T>
T shuffle(const char* op, unsigned mask, T var, int source)
{
    static_assert(sizeof(T) <= 16, "shuffled values are at most 16 bytes");
    T out = var;
    rendezvous(op, mask, &var, sizeof(T), source, &out, 0, nullptr);
    return out;
}

// Sets the identity of linear thread t of block b (threadIdx, blockIdx, lane, ...).
inline void enter_thread(unsigned t, uint3 b, dim3 grid, dim3 blockdim, Block* state)
{
    thread_idx = uint3(t % blockdim.x, t / blockdim.x % blockdim.y, t / blockdim.x / blockdim.y);
    block_idx = b;
    block_dim = blockdim;
    grid_dim = grid;
    block = state;
    lane = t % warp_size;
    warp = t / warp_size;
}

// What a thread does after the kernel body returns: it leaves its warp and the block's barrier.
inline void exit_thread()
{
    leave_warp();
    block->barrier->arrive_and_drop();
}

#ifdef EMU_FIBERS
constexpr size_t fiber_stack_bytes = 128 * 1024;

template <class Body>
void run_body(void* body) { (*static_cast<Body*>(body))(); }

[[noreturn]] inline void fiber_entry()
{
    Scheduler& s = *scheduler;
    s.run(s.body);
    exit_thread();
    s.fibers[s.current].done = true;
    note_progress();
    switch_context(s.fibers[s.current].context, s.main);  // never resumed
    __builtin_unreachable();
}

// Runs one block's threads as fibers, round-robin, until all return; 1 after a deadlock.
template <class Body>
int run_block_as_fibers(Body& body, Fiber* fibers, unsigned threads, uint3 b, dim3 grid, dim3 blockdim, Block& state)
{
    Scheduler s;
    s.fibers = fibers;
    s.run = &run_body<Body>;
    s.body = &body;
    Scheduler* previous = scheduler;
    scheduler = &s;
    for (unsigned t = 0; t < threads; ++t) {
        Fiber& f = fibers[t];
        f.done = false;
        f.waiting_at = nullptr;
        make_context(f.context, f.stack, fiber_stack_bytes, fiber_entry);
    }
    unsigned live = threads;
    int code = 0;
    while (live) {
        const unsigned long long before = s.progress;
        for (unsigned t = 0; t < threads; ++t) {
            if (fibers[t].done) continue;
            s.current = t;
            enter_thread(t, b, grid, blockdim, &state);
            switch_context(s.main, fibers[t].context);
            if (fibers[t].done) --live;
        }
        if (live && s.progress == before) {
            unsigned at_barrier = 0, first = threads;
            for (unsigned t = 0; t < threads; ++t) {
                if (fibers[t].done) continue;
                at_barrier += std::strcmp(fibers[t].waiting_at, "__syncthreads") == 0;
                if (first == threads) first = t;
            }
            fail(deadlock, "deadlock in block %u: %u live threads wait forever (%u at __syncthreads, %u at a warp "
                 "intrinsic; thread %u at %s)", b.x + grid.x * (b.y + grid.y * b.z), live, at_barrier, live - at_barrier,
                 first, fibers[first].waiting_at);
            code = 1;  // the waiting fibers are abandoned: the next launch lays their stacks out afresh
            break;
        }
    }
    scheduler = previous;
    return code;
}

// One stack per thread of a block, reused by every block of a launch (and by later launches: see
// kept_stacks), with a PROT_NONE page below each so that an overflow stops the process.
class FiberStacks {
  public:
    explicit FiberStacks(unsigned count)
        : page_((size_t)sysconf(_SC_PAGESIZE)), bytes_((fiber_stack_bytes + page_) * count), count_(count),
          fibers_(std::make_unique<Fiber[]>(count))
    {
        region_ = mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (region_ == MAP_FAILED) return;
        for (unsigned t = 0; t < count; ++t) {
            unsigned char* base = (unsigned char*)region_ + t * (fiber_stack_bytes + page_);
            mprotect(base, page_, PROT_NONE);
            fibers_[t].stack = base + page_;
        }
    }
    ~FiberStacks()
    {
        if (region_ != MAP_FAILED) munmap(region_, bytes_);
    }
    FiberStacks(const FiberStacks&) = delete;
    FiberStacks& operator=(const FiberStacks&) = delete;
    bool mapped() const { return region_ != MAP_FAILED; }
    unsigned count() const { return count_; }
    Fiber* fibers() { return fibers_.get(); }

  private:
    size_t page_, bytes_;
    unsigned count_ = 0;
    void* region_ = MAP_FAILED;
    std::unique_ptr<Fiber[]> fibers_;
};

// The stacks of the largest block this slot has run, kept for its next launches (each slot has a
// copy of the library of its own, so this is the slot's): mapping a stack for every thread and
// faulting its first pages in again at every launch took a third of an emulated training step.
// A launch that finds them in use (two host threads launching on one slot) maps its own.
inline std::mutex kept_stacks_mutex;
inline std::unique_ptr<FiberStacks> kept_stacks;
#endif  // EMU_FIBERS

// The OS threads that run the CUDA threads of a slot's blocks, kept from block to block and from
// launch to launch: an OS thread started and ended per CUDA thread was most of a sanitized check's
// time (ThreadSanitizer maps and releases memory for each). Every worker has a start and a done
// semaphore of its own and shares no lock with the others, so nothing orders the threads of a
// block but what the kernel does (barriers, warp intrinsics): ThreadSanitizer sees them as
// unordered, as it did with a thread per CUDA thread. The workers are never stopped (they wait at
// their semaphore until the process ends); a forked child starts its own.
class Crew {
  public:
    using Work = void (*)(void* job, unsigned thread);

    // Runs work(job, t) for t in [0, count) on count threads at once; returns when all have returned.
    void run(unsigned count, Work work, void* job)
    {
        std::lock_guard<std::mutex> one_launch_at_a_time(mutex_);
        if (owner_ != getpid()) {  // after a fork the workers are the parent's: leave them
            workers_.clear();
            owner_ = getpid();
        }
        while (workers_.size() < count) workers_.push_back(new Worker());  // never freed: see above
        for (unsigned t = 0; t < count; ++t) {
            Worker& w = *workers_[t];
            w.work = work;
            w.job = job;
            w.thread_index = t;
            sem_post(&w.start);
        }
        for (unsigned t = 0; t < count; ++t)
            while (sem_wait(&workers_[t]->done) != 0) {
            }
    }

  private:
    struct Worker {
        sem_t start, done;
        Work work = nullptr;
        void* job = nullptr;
        unsigned thread_index = 0;
        Worker()
        {
            sem_init(&start, 0, 0);
            sem_init(&done, 0, 0);
            std::thread([this] {
                for (;;) {
                    while (sem_wait(&start) != 0) {
                    }
                    work(job, thread_index);
                    sem_post(&done);
                }
            }).detach();
        }
    };
    std::mutex mutex_;
    pid_t owner_ = 0;
    std::vector<Worker*> workers_;
};
inline Crew crew;

// Runs one block's threads as OS threads (the slot's crew) until all return; 0 (a deadlock hangs here).
template <class Body>
int run_block_as_threads(Body& body, unsigned threads, uint3 b, dim3 grid, dim3 blockdim, Block& state)
{
    struct Job {
        Body* body;
        uint3 b;
        dim3 grid, blockdim;
        Block* state;
    } job{&body, b, grid, blockdim, &state};
    crew.run(threads, [](void* p, unsigned t) {
        Job& j = *static_cast<Job*>(p);
        enter_thread(t, j.b, j.grid, j.blockdim, j.state);
        (*j.body)();
        exit_thread();
    }, &job);
    return 0;
}

constexpr unsigned mode_os_threads = 1;  // launch modes (bits): each CUDA thread an OS thread, else a fiber
constexpr unsigned mode_ucontext = 2;    // fibers switched with ucontext

// Runs the blocks k = slot, slot + slots, ... of a grid, one after another, each as
// block.x*block.y*block.z threads: OS threads (the slot's crew) where ``mode`` has mode_os_threads,
// else fibers (builds with EMU_FIBERS: those without a sanitizer), switched with ucontext where it
// has mode_ucontext. Returns 0, or 1 after a recorded error (see emu_last_error).
template <class Body>
int launch(dim3 grid, dim3 blockdim, unsigned shared_bytes, unsigned slot, unsigned slots, unsigned mode, Body body)
{
    const unsigned threads_per_block = blockdim.x * blockdim.y * blockdim.z;
    const unsigned warps = (threads_per_block + warp_size - 1) / warp_size;
    const unsigned long long blocks = (unsigned long long)grid.x * grid.y * grid.z;
    const bool os_threads = mode & mode_os_threads;
#ifdef EMU_FIBERS
    std::unique_lock<std::mutex> keeping(kept_stacks_mutex, std::defer_lock);
    std::unique_ptr<FiberStacks> own;
    FiberStacks* stacks = nullptr;
    if (!os_threads) {
#ifdef EMU_STACK_SWITCH
        use_ucontext = mode & mode_ucontext;
#endif
        if (keeping.try_lock()) {
            if (!kept_stacks || !kept_stacks->mapped() || kept_stacks->count() < threads_per_block) {
                kept_stacks.reset();  // unmapped before the larger one is mapped
                kept_stacks = std::make_unique<FiberStacks>(threads_per_block);
            }
            stacks = kept_stacks.get();
        } else {
            own = std::make_unique<FiberStacks>(threads_per_block);
            stacks = own.get();
        }
        if (!stacks->mapped()) {
            fail(no_memory, "cannot map %u fiber stacks", threads_per_block);
            return 1;
        }
    }
#else
    if (!os_threads) {
        fail(no_fibers, "this build runs CUDA threads as OS threads only (a sanitizer's build)");
        return 1;
    }
#endif
    for (unsigned long long k = slot; k < blocks; k += slots) {
        const uint3 b((unsigned)(k % grid.x), (unsigned)(k / grid.x % grid.y), (unsigned)(k / grid.x / grid.y));
        Barrier barrier((std::ptrdiff_t)threads_per_block, os_threads);
        Block state{&barrier, std::make_unique<Warp[]>(warps), (unsigned char*)std::malloc(shared_bytes)};
        if (shared_bytes) std::memset(state.dynamic_shared, 0xff, shared_bytes);
        for (unsigned t = 0; t < threads_per_block; ++t) state.warps[t / warp_size].existing |= 1u << (t % warp_size);
        for (unsigned v = 0; v < warps; ++v) state.warps[v].alive = state.warps[v].existing;
#ifdef EMU_FIBERS
        const int code = os_threads ? run_block_as_threads(body, threads_per_block, b, grid, blockdim, state)
                                    : run_block_as_fibers(body, stacks->fibers(), threads_per_block, b, grid, blockdim, state);
#else
        const int code = run_block_as_threads(body, threads_per_block, b, grid, blockdim, state);
#endif
        std::free(state.dynamic_shared);
        if (code) break;  // a deadlock: the block's fibers never finish
    }
    std::lock_guard<std::mutex> guard(error_mutex);
    return errors.empty() ? 0 : 1;
}
}  // namespace emu

// The recorded errors, sorted (the order lanes report in depends on scheduling), at most 3 of them.
extern "C" __attribute__((visibility("default"))) const char* emu_last_error()
{
    std::lock_guard<std::mutex> guard(emu::error_mutex);
    std::vector<std::pair<int, std::string>> sorted = emu::errors;
    std::sort(sorted.begin(), sorted.end());
    sorted.erase(std::unique(sorted.begin(), sorted.end()), sorted.end());
    emu::error_report.clear();
    for (size_t k = 0; k < sorted.size() && k < 3; ++k) emu::error_report += (k ? "; " : "") + sorted[k].second;
    if (sorted.size() > 3) emu::error_report += "; and " + std::to_string(sorted.size() - 3) + " more";
    return emu::error_report.c_str();
}

extern "C" __attribute__((visibility("default"))) void emu_clear_error()
{
    std::lock_guard<std::mutex> guard(emu::error_mutex);
    emu::errors.clear();
}

using std::exp;
using std::max;
using std::min;
using std::sqrt;

inline void* dynamic_shared_memory() { return emu::block->dynamic_shared; }

template <typename T>
inline T atomicAdd(T* address, T value)
{
    return std::atomic_ref<T>(*address).fetch_add(value);
}

// A fence between a thread's writes to global memory and what it does next. ThreadSanitizer does
// not model fences (and g++ warns about them under it), so there it is left out: the atomicAdd
// a kernel takes its ticket with (sequentially consistent) orders the blocks for the sanitizer.
inline void __threadfence()
{
#ifndef __SANITIZE_THREAD__
    std::atomic_thread_fence(std::memory_order_seq_cst);
#endif
}

// A load that skips the SM's L1 cache on the GPU (for data other blocks wrote during the launch);
// the CPU has one coherent memory.
template <typename T>
inline T __ldcg(const T* address)
{
    return *address;
}

template <class T>
inline T __shfl_sync(unsigned mask, T var, int src_lane, int width = 32)
{
    const int source = (int)(emu::lane & ~(unsigned)(width - 1)) + (src_lane & (width - 1));
    return emu::shuffle("__shfl_sync", mask, var, source);
}

template <class T>
inline T __shfl_down_sync(unsigned mask, T var, unsigned delta, int width = 32)
{
    const unsigned in_segment = emu::lane & (unsigned)(width - 1);
    const int source = in_segment + delta < (unsigned)width ? (int)(emu::lane + delta) : -1;
    return emu::shuffle("__shfl_down_sync", mask, var, source);
}

template <class T>
inline T __shfl_up_sync(unsigned mask, T var, unsigned delta, int width = 32)
{
    const unsigned in_segment = emu::lane & (unsigned)(width - 1);
    const int source = in_segment >= delta ? (int)(emu::lane - delta) : -1;
    return emu::shuffle("__shfl_up_sync", mask, var, source);
}

template <class T>
inline T __shfl_xor_sync(unsigned mask, T var, int lane_mask, int width = 32)
{
    const unsigned target = emu::lane ^ (unsigned)lane_mask;
    const bool same_segment = (target & ~(unsigned)(width - 1)) == (emu::lane & ~(unsigned)(width - 1));
    return emu::shuffle("__shfl_xor_sync", mask, var, same_segment && target < emu::warp_size ? (int)target : -1);
}

inline unsigned __ballot_sync(unsigned mask, int predicate)
{
    unsigned bits = 0;
    emu::rendezvous("__ballot_sync", mask, nullptr, 0, -1, nullptr, predicate != 0, &bits);
    return bits;
}

inline void __syncwarp(unsigned mask = 0xffffffffu)
{
    emu::rendezvous("__syncwarp", mask, nullptr, 0, -1, nullptr, 0, nullptr);
}

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)  // a register budget for the GPU compiler; nothing to emulate
#define __align__(n) alignas(n)
#define __shared__ static
#define __syncthreads() emu::syncthreads()
#define threadIdx emu::thread_idx
#define blockIdx emu::block_idx
#define blockDim emu::block_dim
#define gridDim emu::grid_dim
#define warpSize 32
