/*
 * The run-lease protocol and the sink fence, as a Promela model for spin.
 *
 * One key of N items; H holder processes race for it through the lease store (one row, one
 * token sequence) and write its items through the sink (fence row, ledger unique on item,
 * business rows). Each atomic block below is one SQL statement (or one sink commit) and names
 * the statement it mirrors with its hash:  @sql <kind>:<name> sha=<12 hex>.
 * tests/model/sql_hashes.py recomputes them from the SQL files; a changed statement fails
 * tests/model/test_protocol_model.py until the block beside it is looked at and re-hashed:
 *
 *     .venv/bin/python -m tests.model.sql_hashes --check     # what changed
 *     .venv/bin/python -m tests.model.sql_hashes --update    # after the model matches again
 *
 * Faults (at most FAULTS in a run; then they stop, for the liveness claim): a holder crashes
 * (SIGKILL) and is started again as a new process; a holder's keeper misses its local deadline
 * (the holder paused idle, SIGSTOP, or its renewals did not get through); a holder paused inside
 * a sink transaction (its session ended by idle_in_transaction_session_timeout) or the sink
 * connection cut mid-transaction; the store or the sink crashes and restarts; an ambiguous
 * commit (the statement committed, the client saw an error: acquire, sink commit, finish); a
 * try failing and failing its lease. A pause is also every interleaving in which a holder does
 * not move while the others do.
 *
 * Time is abstract: `expired` (server side, expires_at < now()) and `ldl[h]` (the keeper's
 * local deadline has not passed). The keeper's deadline counts from when a renew was SENT, the
 * server's expiry from when it ARRIVED, so the local deadline always passes first: the server
 * may expire a lease only once no holder of its token still trusts its local deadline (KEEPER
 * below; the mutation test removes that guard).
 */

#define H 3
#define N 2
#ifndef FAULTS
#define FAULTS 3
#endif
#define NOBODY 255

mtype = { NONE, RUNNING, SUCCEEDED, FAILED };

/* the lease store's row of the key: durable, a store crash loses no committed statement */
mtype lstate = NONE;
byte ltoken = 0;
byte lholder = NOBODY;       /* holder process h; h + H once that process is gone */
bool expired = false;
byte seq = 0;                /* runlease.fencing_token: never goes back */
bool store_up = true;

/* the sink's database */
bool sink_up = true;
byte fence = 0;              /* runfence.fence.token of the key (committed) */
byte fence_lock = NOBODY;    /* holder whose open transaction holds the fence row */
bool ledger[N];              /* runfence.ledger rows of the key */
byte effect[N];              /* ghost: business rows of each item (what the checker counts) */
byte maxf = 0;               /* ghost: highest token whose fenced transaction committed */

/* the holders */
byte tok[H];                 /* the token the holder works under (0: none) */
bool ldl[H];                 /* its keeper's local deadline has not passed */
bool lost[H];                /* its keeper declared the lease lost */
bool crash[H];               /* SIGKILL requested */
bool killed[H];              /* the sink ended the holder's open transaction */

byte faults = 0;
#define FAULT (faults < FAULTS)
#define ME h
#define LIVE_HOLDER (lstate == RUNNING && !expired)
#define ALL_DONE (ledger[0] && ledger[1] && effect[0] == 1 && effect[1] == 1)
/* some holder of the row's token still trusts its local deadline */
#define TRUSTED ((ldl[0] && tok[0] == ltoken) || (ldl[1] && tok[1] == ltoken) || \
                 (ldl[2] && tok[2] == ltoken))
#define KEEPER !TRUSTED

proctype holder(byte h) {
    byte i;
    bool claimed;
    bool done = false;
    do
    :: done -> break
    :: !done -> {
        tok[h] = 0; ldl[h] = false; lost[h] = false; i = 0;
acquire:
        do
        /* @sql queries:acquire sha=a0fc8d646192 */
        /* @sql queries:acquire_decided sha=c6b591ebb647 */
        /* @sql function:runlease.acquire sha=e4d28247696a */
        :: atomic { store_up && lstate == SUCCEEDED -> done = true; ldl[h] = false; goto finished }
        :: atomic { store_up && LIVE_HOLDER && lholder != ME -> skip };
           /* held: defer until released or expired */
           (lstate != RUNNING || expired)
        :: atomic { store_up && lstate != SUCCEEDED && !(LIVE_HOLDER && lholder != ME) ->
               if
               :: lstate == RUNNING && lholder == ME -> skip /* its own lease again, renewed */
               :: else ->
                  /* granted, or taken over from an expired holder: a new, higher token */
                  /* keeper: a taken-over holder no longer trusts its local deadline */
                  assert(lstate != RUNNING || !TRUSTED);
                  seq++; ltoken = seq; lstate = RUNNING; lholder = ME
               fi;
               expired = false;
               if
               :: FAULT -> faults++   /* ambiguous: granted, the answer lost; ask again */
               :: true -> tok[h] = ltoken; ldl[h] = true; break
               fi
           }
        od;
work:
        do
        :: i == N -> break
        :: i < N && lost[h] -> goto restart          /* keeper.check(): LeaseLost, stop */
        :: i < N && !lost[h] && FAULT ->
           atomic { faults++; }                      /* the try fails: fail its lease */
           /* finish matches key, token and holder: the model's token guard (a holder's
              token is its own, so the holder match only narrows it) */
           /* @sql queries:finish sha=57b562df22a3 */
           atomic { store_up ->
               ldl[h] = false;                       /* its keeper stopped first */
               if
               :: lstate == RUNNING && ltoken == tok[h] -> lstate = FAILED
               :: else -> skip
               fi }
           goto restart
        :: i < N && !lost[h] ->
           killed[h] = false;
           /* fenced_transaction: the fence advanced first, under the fence row's lock (a
              holder frozen inside its statement is ended by the newer holder's bounded
              advance, fence_end_older_holders: modelled as the killed/cut session below) */
           /* @sql queries:fence_advance_bounded sha=686fee3265f3 */
           /* An external call's two fenced steps are this same advance fused into one
              statement with their writes, one commit each: the intended claim (its write is
              the intent row, no ledger row) and the answer's record (the answer, then the
              ledger row as ledger_claim below, then the caller's writes). The processor's
              side of the call is not modelled. Either step may take a batch of items
              (call_many): one advance, then the items' writes, one commit. The model does
              not check batches: it has one item outstanding per holder, in order. That a
              batch is safe is argued, not checked: each item's write is guarded by the same
              token check under the fence row's lock, and the ledger and the intended state
              are per item, so a batch cannot accept a superseded token's write or do an
              item twice that one item at a time could not.
              @sql queries:external_call_claim sha=32baf2ce8290
              @sql queries:external_call_answer sha=52824dbd37ac */
           atomic { sink_up && fence_lock == NOBODY ->
               if
               :: fence <= tok[h] -> fence_lock = h          /* GUARD: fence token */
               :: else -> goto restart                        /* StaleToken: stop */
               fi }
           /* one ledger generation: an approved re-run's next one starts an empty ledger,
              which this model does not explore */
           /* @sql queries:ledger_claim sha=d0f8da4a2a5a */
           /* @sql table:runfence.ledger sha=32aa930dd8b0 */
           atomic { claimed = (!killed[h] && !ledger[i]) }
           /* the business row and the commit */
           atomic {
               if
               :: killed[h] -> skip                  /* rolled back: reconnect, redo the item */
               :: !killed[h] ->
                  assert(tok[h] >= maxf);            /* no write from a superseded token */
                  fence = tok[h];
                  if :: maxf < tok[h] -> maxf = tok[h] :: else -> skip fi;
                  if
                  :: claimed -> ledger[i] = true; effect[i]++;
                                assert(effect[i] <= 1)   /* no item's effect twice */
                  :: else -> skip                        /* done already: skipped */
                  fi;
                  fence_lock = NOBODY;
                  if
                  :: FAULT -> faults++               /* ambiguous: committed, error seen */
                  :: true -> i++
                  fi
               fi }
        od;
        /* the keeper stops just before the completion is sent; a pause there is a missed
           deadline like any other */
complete:
        /* @sql queries:finish sha=57b562df22a3 */
        atomic { store_up ->
            if
            :: lstate == RUNNING && ltoken == tok[h] ->
               assert(ALL_DONE);                     /* succeeded only when every item is */
               lstate = SUCCEEDED;
               if
               :: FAULT -> faults++; goto complete   /* ambiguous: finished, error seen */
               :: true -> done = true; ldl[h] = false; goto finished
               fi
            /* the same call again finds its own finish */
            :: lstate == SUCCEEDED && ltoken == tok[h] -> done = true; ldl[h] = false;
                                                          goto finished
            :: else -> goto restart                  /* LeaseLost: superseded */
            fi }
restart:
        skip;
finished:
        skip
       } unless { crash[h] };
       atomic {
           if
           :: crash[h] ->
              /* SIGKILL: the OS closes its connections, its open transaction rolls back */
              if :: fence_lock == h -> fence_lock = NOBODY :: else -> skip fi;
              crash[h] = false
           :: else -> skip
           fi;
           if :: fence_lock == h -> fence_lock = NOBODY :: else -> skip fi;
           ldl[h] = false; lost[h] = false;
           /* started again as a new process: the row's holder is no longer this one */
           if :: lholder == h -> lholder = h + H :: else -> skip fi
       }
    od
}

/* Time, the keepers' renewals and the faults from outside the holders. */
proctype world() {
    byte h;
end:
    do
    /* the server's expiry, once no holder of the token trusts its deadline */
    :: atomic { LIVE_HOLDER && KEEPER -> expired = true }
    /* a keeper's renewal */
    /* @sql queries:renew sha=bcd83487964a */
    :: atomic { store_up && tok[0] != 0 && !lost[0] && !ldl[0] ->
           if :: lstate == RUNNING && ltoken == tok[0] && lholder == 0 -> ldl[0] = true; expired = false
              :: else -> lost[0] = true fi }
    :: atomic { store_up && tok[1] != 0 && !lost[1] && !ldl[1] ->
           if :: lstate == RUNNING && ltoken == tok[1] && lholder == 1 -> ldl[1] = true; expired = false
              :: else -> lost[1] = true fi }
    :: atomic { store_up && tok[2] != 0 && !lost[2] && !ldl[2] ->
           if :: lstate == RUNNING && ltoken == tok[2] && lholder == 2 -> ldl[2] = true; expired = false
              :: else -> lost[2] = true fi }
    /* renewals failing past the local deadline (the store away): the keeper gives up */
    :: atomic { !store_up && tok[0] != 0 && !ldl[0] && !lost[0] -> lost[0] = true }
    :: atomic { !store_up && tok[1] != 0 && !ldl[1] && !lost[1] -> lost[1] = true }
    :: atomic { !store_up && tok[2] != 0 && !ldl[2] && !lost[2] -> lost[2] = true }
    /* a local deadline passes: free while the store is away, else a pause (a fault) */
    :: atomic { !store_up && (ldl[0] || ldl[1] || ldl[2]) ->
                if :: ldl[0] -> ldl[0] = false :: ldl[1] -> ldl[1] = false
                                 :: ldl[2] -> ldl[2] = false fi }
    :: atomic { store_up && (ldl[0] || ldl[1] || ldl[2]) && FAULT -> faults++;
                if :: ldl[0] -> ldl[0] = false :: ldl[1] -> ldl[1] = false
                   :: ldl[2] -> ldl[2] = false fi }
    /* a holder SIGKILLed */
    :: atomic { FAULT -> faults++; select(h : 0 .. H - 1); crash[h] = true; ldl[h] = false }
    /* an open sink transaction ended: idle timeout of a paused holder, connection cut */
    :: atomic { fence_lock != NOBODY && FAULT -> faults++; killed[fence_lock] = true;
                fence_lock = NOBODY }
    /* the store crashes (committed rows survive) and restarts */
    :: atomic { store_up && FAULT -> faults++; store_up = false }
    :: atomic { !store_up -> store_up = true }
    /* the sink crashes (its open transaction rolls back) and restarts */
    :: atomic { sink_up && FAULT -> faults++; sink_up = false;
                if :: fence_lock != NOBODY -> killed[fence_lock] = true; fence_lock = NOBODY
                   :: else -> skip fi }
    :: atomic { !sink_up -> sink_up = true }
    od
}

init {
    atomic {
        run holder(0); run holder(1); run holder(2); run world()
    }
}

/* once the faults stop, the key completes */
ltl completes { <> (lstate == SUCCEEDED) }
